"""The step kinds of an execution plan, each declared once.

A step is one thing an island (or, for a `Branch`, the client) does in a
run. Each kind is one frozen dataclass here, and the class answers what
every consumer asks of a step, so that none of them switches on the kind:

    kind        its name in JSON plans
    op          the IR op `pw-emit-plans` writes for it; `from_attrs(attrs, plans)` reads it back
    op_attributes  that op's attributes and their Python kinds (`pw-verify-plans` checks them)
    on_host     whether the client runs it (between subgraphs), not an island
    reads()     the buffers whose values it reads
    produced()  the buffers it writes on its own island (or the host)
    frees()     the buffers it drops (its memory effect)
    arrives()   the buffers among `produced()` that another island's step sends it
    consumed()  what it must come after the writers of: reads() and frees()
    cost(plan)  its work on each device of its slice (`LaunchCost`), or None for a step that does none

The kinds:

    Launch  run an executable on a slice's devices: inputs -> outputs
    Copy    move/reshard a buffer between two slices of the same island (ICI)
    Send    hand a buffer to another island over DCN (pairs with a Recv)
    Recv    receive a buffer from another island (pairs with a Send)
    Free    drop buffers after their last use
    Branch  host step: read a tensor<i1> buffer, run the `then` or `else` plan

Adding a kind: its class here, its IRDL op (`dialect/pw.irdl.mlir`, and its
builder in `dialect/ops.py`), its emitter (`passes/emit_plans.py`), its
island instruction (`runtime/island_program.py`) and its tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from .plan import ProgramPlan


@dataclass(frozen=True)
class LaunchCost:
    """A launch's work on each of the `devices` of its slice, and the all-reduces that combine its outputs
    (`dialect/device_time.py` times the work at a device kind's rates).

    `all_reduces` holds (bytes per device, devices in each group) per output combined.
    """

    flops: int
    bytes: int
    all_reduces: tuple[tuple[int, int], ...] = ()
    devices: int = 1


@dataclass(frozen=True)
class Step:
    """The fields every step has; see the subclasses for the kinds."""

    kind: ClassVar[str] = ""
    op: ClassVar[str] = ""
    on_host: ClassVar[bool] = False
    op_attributes: ClassVar[dict[str, type]] = {"step": int, "after": tuple, "subgraph": int}
    id: int
    after: tuple[int, ...] = ()
    subgraph: int = 0
    label: str = ""

    def reads(self) -> tuple[int, ...]:
        """Returns the buffers whose values the step reads."""
        return ()

    def produced(self) -> tuple[int, ...]:
        """Returns the buffers the step writes on its own island (or the host)."""
        return ()

    def frees(self) -> tuple[int, ...]:
        """Returns the buffers the step drops from its island's devices."""
        return ()

    def arrives(self) -> tuple[int, ...]:
        """Returns the buffers of `produced()` whose value another island's step sends."""
        return ()

    def consumed(self) -> tuple[int, ...]:
        """Returns the buffers the step must come after the writers of: those it reads or frees."""
        return (*self.reads(), *self.frees())

    def cost(self, plan: "ProgramPlan") -> LaunchCost | None:
        """Returns the step's work on each device of its slice in `plan`, or None if it computes nothing (a
        move's time is its link's, which the simulator models)."""
        return None

    @classmethod
    def from_attrs(cls, a: dict[str, Any], plans: dict[str, "ProgramPlan"]) -> "Step":
        """Returns the step its op describes, from the op's attributes `a` (as `ops.attrs` gives them);
        `plans` holds the plans of the programs the step may run (a `Branch`'s)."""
        return cls(**cls._common(a))

    @staticmethod
    def _common(a: dict[str, Any]) -> dict[str, Any]:
        """Returns the fields every kind reads from its op's attributes `a` (as `ops.attrs` gives them)."""
        return {"id": a["step"], "after": a["after"], "subgraph": a["subgraph"]}


@dataclass(frozen=True)
class Launch(Step):
    """Runs `executable` on the devices of `slice`: buffers `inputs` -> `outputs`."""

    kind: ClassVar[str] = "launch"
    op: ClassVar[str] = "pw.launch"
    op_attributes: ClassVar[dict[str, type]] = {
        **Step.op_attributes, "label": str, "executable": str, "slice": str, "devices": tuple, "inputs": tuple,
        "outputs": tuple, "output_bytes": tuple}
    executable: str = ""
    slice: str = ""
    inputs: tuple[int, ...] = ()
    outputs: tuple[int, ...] = ()

    def reads(self):
        return self.inputs

    def produced(self):
        return self.outputs

    def cost(self, plan):
        """The work of the executable (its `pw.cost` flops, kept in the plan) divided over the most distinct
        shards any operand has (SPMD partitioning splits the work as finely as its most split operand), and
        the bytes of the input and output shards on one device. An output with fewer distinct shards than
        the work was split into is combined across the devices that computed its parts: an all-reduce among
        `ways / shards` devices."""
        placement = plan.slices[self.slice]
        sizes = dict(zip(placement.axes, placement.shape))

        def shards(buffer: int) -> int:
            return math.prod(sizes.get(a, 1) for axes in plan.buffers[buffer].sharding for a in axes)
        operands = (*self.inputs, *self.outputs)
        ways = max((shards(b) for b in operands), default=1)
        nbytes = sum(plan.buffers[b].bytes_per_device for b in operands)
        reduces = tuple((plan.buffers[b].bytes_per_device, ways // shards(b)) for b in self.outputs
                        if shards(b) < ways)
        return LaunchCost(plan.flops.get(self.executable, 0) // ways, nbytes, reduces, math.prod(placement.shape))

    @classmethod
    def from_attrs(cls, a, plans):
        return cls(label=a["label"], executable=a["executable"], slice=a["slice"], inputs=a["inputs"],
                   outputs=a["outputs"], **cls._common(a))


@dataclass(frozen=True)
class Move(Step):
    """A data movement from `src_buffer` to `dst_buffer` over `link` ("ici" or "dcn"), `bytes` per device."""

    src_buffer: int = -1
    dst_buffer: int = -1
    link: str = ""
    bytes: int = 0


@dataclass(frozen=True)
class Copy(Move):
    """Moves (and reshards) a buffer between slices of one island (ICI)."""

    kind: ClassVar[str] = "copy"
    op: ClassVar[str] = "pw.copy"
    op_attributes: ClassVar[dict[str, type]] = {
        **Step.op_attributes, "src_buffer": int, "dst_buffer": int, "link": str, "bytes": int}

    def reads(self):
        return (self.src_buffer,)

    def produced(self):
        return (self.dst_buffer,)

    @classmethod
    def from_attrs(cls, a, plans):
        return cls(src_buffer=a["src_buffer"], dst_buffer=a["dst_buffer"], link=a["link"], bytes=a["bytes"],
                   **cls._common(a))


@dataclass(frozen=True)
class _Exchange(Move):
    """A move between islands: its op's `buffer` is this island's end, `peer_buffer` island `peer`'s."""

    peer: str = ""
    op_attributes: ClassVar[dict[str, type]] = {
        **Step.op_attributes, "buffer": int, "peer_buffer": int, "peer": str, "link": str, "bytes": int,
        "devices": tuple}

    @classmethod
    def _from_ends(cls, a, src: int, dst: int):
        return cls(src_buffer=src, dst_buffer=dst, link=a["link"], peer=a["peer"], bytes=a["bytes"],
                   **cls._common(a))


@dataclass(frozen=True)
class Send(_Exchange):
    """Hands `src_buffer` to island `peer`, where it becomes `dst_buffer` (a `Recv`)."""

    kind: ClassVar[str] = "send"
    op: ClassVar[str] = "pw.send"

    def reads(self):
        return (self.src_buffer,)

    @classmethod
    def from_attrs(cls, a, plans):
        return cls._from_ends(a, a["buffer"], a["peer_buffer"])


@dataclass(frozen=True)
class Recv(_Exchange):
    """Receives `dst_buffer` from island `peer`'s `src_buffer`; `after` names the `Send`."""

    kind: ClassVar[str] = "recv"
    op: ClassVar[str] = "pw.recv"

    def produced(self):
        return (self.dst_buffer,)

    def arrives(self):
        return (self.dst_buffer,)

    @classmethod
    def from_attrs(cls, a, plans):
        return cls._from_ends(a, a["peer_buffer"], a["buffer"])


@dataclass(frozen=True)
class Free(Step):
    """Drops `buffers` from the island's devices: their last reader has run."""

    kind: ClassVar[str] = "free"
    op: ClassVar[str] = "pw.free"
    op_attributes: ClassVar[dict[str, type]] = {**Step.op_attributes, "buffers": tuple}
    buffers: tuple[int, ...] = ()

    def frees(self):
        return self.buffers

    @classmethod
    def from_attrs(cls, a, plans):
        return cls(buffers=a["buffers"], **cls._common(a))


@dataclass(frozen=True)
class Branch(Step):
    """Host step: reads `pred_buffer`, runs `then_plan` or `else_plan` on `inputs` into `outputs` (None in a
    step read without the plans of its branch programs, as `pw-verify-plans` reads it)."""

    kind: ClassVar[str] = "cond"
    op: ClassVar[str] = "pw.branch"
    on_host: ClassVar[bool] = True
    op_attributes: ClassVar[dict[str, type]] = {
        **Step.op_attributes, "label": str, "pred": int, "inputs": tuple, "outputs": tuple, "then_program": str,
        "else_program": str}
    pred_buffer: int = -1
    inputs: tuple[int, ...] = ()
    outputs: tuple[int, ...] = ()
    then_plan: "ProgramPlan | None" = None
    else_plan: "ProgramPlan | None" = None

    def reads(self):
        return (self.pred_buffer, *self.inputs)

    def produced(self):
        return self.outputs

    @classmethod
    def from_attrs(cls, a, plans):
        return cls(label=a["label"], pred_buffer=a["pred"], inputs=a["inputs"], outputs=a["outputs"],
                   then_plan=plans.get(a["then_program"]), else_plan=plans.get(a["else_program"]), **cls._common(a))


KINDS: tuple[type[Step], ...] = (Launch, Copy, Send, Recv, Free, Branch)
STEP_KINDS: dict[str, type[Step]] = {cls.kind: cls for cls in KINDS}   # JSON kind -> class
STEP_OPS: dict[str, type[Step]] = {cls.op: cls for cls in KINDS}       # IR op name -> class
