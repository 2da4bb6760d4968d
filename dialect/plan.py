"""Execution plans: what each island's executors do for one lowered program.

`pw-emit-plans` writes one `builtin.module {pw.island_plan}` per island into
the IR (readable in lit tests) and `pw-plan-memory` adds the frees and each
island's static peak; this module is the same content as plain Python data,
serialised to compact JSON for a runtime in another process.

A `ProgramPlan` is self-contained: the topology, every slice's placement,
every buffer's shape, dtype, sharding and home, every compiled function's
`jax.export` serialisation (or, for a fused launch, the calls it makes), and
per island the steps in the island's consistent order with the island's
peak bytes per device. Steps name buffers by integer id and have ids unique
in the program, so `after` can name a step of another island (a `Recv`
waits for its `Send`).

Steps are a tagged union, one class per kind, declared in plan_steps.py:
`Launch`, `Copy`, `Send`, `Recv`, `Free` and the host's `Branch`.

`ProgramPlan.from_python` checks what it reads and `validate()` checks that
the plan can run (ids exist, every read has a writer, orders respect the
dependencies, sizes match shapes): a plan from a file or another process is
rejected with one `PlanError` line before any host or device work.
"""

from __future__ import annotations

import functools
import heapq
import json
import math
from dataclasses import dataclass
from typing import Any

from .element_types import ELEMENT_BYTES
from .plan_json import JsonReader, PlanError, jsonable, step_from_python, step_to_python
from .plan_steps import Branch, Launch, Move, Recv, Send, Step
from .sharding import Sharding, zero_size
from .topology import Topology, TopologyError

MAX_ELEMENTS = 1 << 40     # a larger buffer is a malformed plan, not a big one
MAX_DEPTH = 16             # branch plans nested deeper than this are rejected
MAX_FLOPS = (1 << 63) - 1  # an executable's flops are an i64 (`pw.cost`), as the IR keeps them


@dataclass(frozen=True)
class SlicePlacement:
    """Where a virtual slice lives: island and island-local device ranges."""

    name: str
    shape: tuple[int, ...]
    axes: tuple[str, ...]
    island: str
    devices: tuple[int, ...]   # half-open ranges [b0, e0, b1, e1, ...] in mesh order

    def device_ids(self) -> list[int]:
        """Returns the island-local device ids in mesh order (O(size): runtime use only)."""
        return [d for b, e in zip(self.devices[::2], self.devices[1::2]) for d in range(b, e)]

    @property
    def ranges(self) -> list[tuple[int, int]]:
        """Returns the device ranges as (begin, end) pairs."""
        return list(zip(self.devices[::2], self.devices[1::2]))


@dataclass(frozen=True)
class BufferInfo:
    """A logical sharded buffer: one id however many shards it has."""

    id: int
    shape: tuple[int, ...]
    dtype: str                        # MLIR element type: "f32", "bf16", "i32", "i1", ...
    slice: str | None                 # None: a host value (program input before placement)
    sharding: tuple[tuple[str, ...], ...]
    bytes_per_device: int             # the size of one shard, for memory accounting


@dataclass(frozen=True)
class FusedCall:
    """One call inside a fused executable: `callee` on values `operands`.

    Values are numbered: the fused executable's arguments first, then the
    results of each call in order. `in_shardings` (`pw-fuse-island`), one per
    operand on the launch's mesh, constrain the operands before the call:
    the copies between slices that the fused executable makes.
    """

    callee: str
    operands: tuple[int, ...]
    results: int
    in_shardings: tuple[tuple[tuple[str, ...], ...], ...] = ()


@dataclass(frozen=True)
class FusedExecutable:
    """An executable made of several in order (`pw-fuse-launches`, `pw-fuse-island`) on its `arguments`
    values (its entry function's; its calls' results are numbered from there); `results` picks its outputs;
    `scratch_bytes` is what its values used only inside hold on each device of the launch."""

    arguments: int
    calls: tuple[FusedCall, ...]
    results: tuple[int, ...]
    scratch_bytes: int = 0


@dataclass(frozen=True)
class Subgraph:
    """A set of steps dispatched as one unit; static if resources are known up front."""

    id: int
    static: bool
    islands: tuple[str, ...]


@dataclass(frozen=True)
class ProgramPlan:
    """Everything a runtime needs to run one lowered program."""

    program: str
    topology: Topology
    slices: dict[str, SlicePlacement]
    buffers: dict[int, BufferInfo]
    executables: dict[str, str]       # name -> base64 jax.export serialisation ("" if none)
    inputs: tuple[int, ...]           # buffers the caller provides, in argument order
    outputs: tuple[int, ...]          # buffers returned, in result order
    islands: dict[str, tuple[Step, ...]]
    subgraphs: tuple[Subgraph, ...] = ()
    host_steps: tuple[Branch, ...] = ()  # run by the client between subgraphs
    # island -> flat (begin, end, bytes) triples: a run's static peak on each device range
    peak_bytes: dict[str, tuple[int, ...]] = None  # type: ignore[assignment]
    fused: dict[str, FusedExecutable] = None       # type: ignore[assignment]
    flops: dict[str, int] = None                   # type: ignore[assignment]  # executable -> its pw.cost flops
    donated: tuple[int, ...] = ()     # inputs the caller donates: their buffers may be reused by results

    def __post_init__(self):
        if self.peak_bytes is None:
            object.__setattr__(self, "peak_bytes", {})
        if self.fused is None:
            object.__setattr__(self, "fused", {})
        if self.flops is None:
            object.__setattr__(self, "flops", {})

    @functools.cached_property
    def distinct_outputs(self) -> tuple[int, ...]:
        """The buffers of `outputs` once each, in the order they first appear: a program that returns one value
        twice (`return y, y`) lists its buffer twice, but it is one result, kept, reserved and released once."""
        return tuple(dict.fromkeys(self.outputs))

    def island_of(self, buffer: int) -> str | None:
        """Returns the island a buffer lives on (None for a host buffer)."""
        return self._islands_of[buffer]

    @functools.cached_property
    def _islands_of(self) -> dict[int, str | None]:
        """Each buffer's island, looked up once per plan: a handle's release asks for its result's (a step
        over a pytree releases hundreds per call)."""
        return {b: None if info.slice is None else self.slices[info.slice].island for b, info in self.buffers.items()}

    def peak(self, island: str) -> list[tuple[int, int, int]]:
        """Returns a run's static peak on `island` as (begin, end, bytes per device) ranges."""
        flat = self.peak_bytes.get(island, ())
        return [tuple(flat[i:i + 3]) for i in range(0, len(flat), 3)]

    # -- dependency graph ---------------------------------------------------

    @functools.cached_property
    def steps(self) -> dict[int, Step]:
        """Returns every step (island and host) by id."""
        return {s.id: s for s in (*(s for ss in self.islands.values() for s in ss), *self.host_steps)}

    @functools.cached_property
    def dependencies(self) -> dict[int, frozenset[int]]:
        """Returns, for every step id, the steps it must follow: its `after` and the writers of what it reads."""
        producer = {b: s.id for s in self.steps.values() for b in s.produced()}
        return {sid: frozenset(s.after) | {producer[b] for b in s.consumed() if b in producer} - {sid}
                for sid, s in self.steps.items()}

    @functools.cached_property
    def topological_order(self) -> tuple[int, ...]:
        """Returns every step id in dependency order, the smallest id first among the ready ones; raises
        PlanError if the dependencies form a cycle."""
        waiting = {sid: set(before) for sid, before in self.dependencies.items()}
        users: dict[int, list[int]] = {}
        for sid, before in waiting.items():
            for b in before:
                users.setdefault(b, []).append(sid)
        ready = [sid for sid, before in waiting.items() if not before]
        heapq.heapify(ready)
        order = []
        while ready:
            sid = heapq.heappop(ready)
            order.append(sid)
            for user in users.get(sid, ()):
                waiting[user].discard(sid)
                if not waiting[user]:
                    heapq.heappush(ready, user)
        if len(order) < len(waiting):
            cycle = _cycle(self.dependencies)
            if cycle is None:
                stuck = min(sid for sid, before in waiting.items() if before)
                raise PlanError(f"plan @{self.program}: step {stuck} waits for a step that does not exist", step=stuck)
            raise PlanError(f"plan @{self.program}: steps form a cycle ({' -> '.join(map(str, cycle))})",
                            step=cycle[1])
        return tuple(order)

    @functools.cached_property
    def conds_before(self) -> dict[int, frozenset[int]]:
        """Returns, for every step id, the host cond steps it waits for, directly or not (a runtime holds
        it back until they are over)."""
        conds = {s.id for s in self.host_steps}
        held: dict[int, frozenset[int]] = {}
        for sid in self.topological_order:
            held[sid] = frozenset().union(*((held[d] | ({d} & conds)) for d in self.dependencies[sid]))
        return held

    def readers(self, island: str) -> dict[int, list[Step]]:
        """Returns, for each buffer that a step of `island` or of the host reads, those steps in plan order (a
        step that reads it twice listed twice)."""
        readers: dict[int, list[Step]] = {}
        for step in (*self.islands.get(island, ()), *self.host_steps):
            for b in step.reads():
                readers.setdefault(b, []).append(step)
        return readers

    def launch_placed(self, island: str) -> frozenset[int]:
        """Returns the buffers of `island` whose one reader is a launch on their own slice that reads them once,
        neither program results nor donated. A host (NumPy) array in such a buffer is placed by that launch
        itself: its executable is compiled with the buffer's home sharding, so JAX's call of it puts the
        array there in C++, in one transfer (runtime/island_program.py; the simulator charges it `launch_input_us`)."""
        return frozenset(
            b for b, steps in self.readers(island).items()
            if len(steps) == 1 and isinstance(launch := steps[0], Launch) and launch.inputs.count(b) == 1
            and launch.slice == self.buffers[b].slice and b not in self.outputs and b not in self.donated)

    # -- serialisation ----------------------------------------------------

    def to_python(self) -> dict[str, Any]:
        """Returns a JSON-ready dict (compact: default-valued step fields are left out)."""
        return {
            "program": self.program,
            "topology": jsonable(self.topology.to_python()),
            "slices": {k: jsonable(v) for k, v in self.slices.items()},
            "buffers": [jsonable(b) for b in self.buffers.values()],
            "executables": dict(self.executables),
            "fused": {k: jsonable(v) for k, v in self.fused.items()},
            "flops": dict(self.flops),
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            **({"donated": list(self.donated)} if self.donated else {}),
            "islands": {k: [step_to_python(s) for s in v] for k, v in self.islands.items()},
            "peak_bytes": {k: list(v) for k, v in self.peak_bytes.items()},
            "subgraphs": [jsonable(s) for s in self.subgraphs],
            "host_steps": [step_to_python(s) for s in self.host_steps],
        }

    def to_json(self) -> str:
        """Returns the plan as compact JSON."""
        return json.dumps(self.to_python(), separators=(",", ":"))

    @staticmethod
    def from_python(value: Any, where: str = "plan", depth: int = 0) -> "ProgramPlan":
        """Rebuilds and validates a plan from `to_python` output; PlanError names what is wrong."""
        if depth > MAX_DEPTH:
            raise PlanError(f"{where}: branch plans nested more than {MAX_DEPTH} deep")
        r = JsonReader(value, where)
        try:
            topology = Topology.from_python(r.get("topology", dict), f"{where}.topology")
        except TopologyError as e:
            raise PlanError(str(e)) from None
        slices = {}
        for name, s in r.get("slices", dict).items():
            sr = r.sub(s, f"slices.{name}", dict)
            slices[name] = SlicePlacement(sr.str("name"), sr.ints("shape"), sr.strs("axes"), sr.str("island"),
                                          sr.ints("devices"))
        buffers = {}
        for i, b in enumerate(r.get("buffers", list)):
            br = r.sub(b, f"buffers[{i}]", dict)
            slice_name = br.get("slice", (str, type(None)))
            sharding = tuple(br.sub(a, f"sharding[{j}]", list).strs_of(a)
                             for j, a in enumerate(br.get("sharding", list)))
            info = BufferInfo(br.int("id"), br.ints("shape"), br.str("dtype"), slice_name, sharding,
                              br.int("bytes_per_device"))
            if info.id in buffers:
                raise PlanError(f"{br.where}: buffer id {info.id} is declared twice")
            buffers[info.id] = info
        executables = {k: r.sub(v, f"executables.{k}", str).value for k, v in r.get("executables", dict).items()}
        fused = {}
        for name, f in r.get("fused", dict, {}).items():
            fr = r.sub(f, f"fused.{name}", dict)
            calls = tuple(FusedCall(cr.str("callee"), cr.ints("operands"), cr.int("results"), tuple(
                              tuple(cr.sub(axes, f"in_shardings[{k}][{d}]", list).strs_of(axes)
                                    for d, axes in enumerate(cr.sub(sharding, f"in_shardings[{k}]", list).value))
                              for k, sharding in enumerate(cr.get("in_shardings", list, []))))
                          for cr in (fr.sub(c, f"calls[{j}]", dict) for j, c in enumerate(fr.get("calls", list))))
            fused[name] = FusedExecutable(fr.int("arguments"), calls, fr.ints("results"),
                                          fr.get("scratch_bytes", int, 0))

        def read_plan(value: Any, at: str) -> ProgramPlan:
            return ProgramPlan.from_python(value, at, depth + 1)

        islands = {k: tuple(step_from_python(s, f"{where}.islands.{k}[{j}]", read_plan)
                            for j, s in enumerate(r.sub(v, f"islands.{k}", list).value))
                   for k, v in r.get("islands", dict).items()}
        host_steps = tuple(step_from_python(s, f"{where}.host_steps[{j}]", read_plan)
                           for j, s in enumerate(r.get("host_steps", list)))
        if any(not s.on_host for s in host_steps):
            raise PlanError(f"{where}.host_steps: only 'cond' steps run on the host")
        subgraphs = tuple(Subgraph(sr.int("id"), sr.get("static", bool), sr.strs("islands"))
                          for sr in (r.sub(s, f"subgraphs[{j}]", dict)
                                     for j, s in enumerate(r.get("subgraphs", list))))
        plan = ProgramPlan(
            program=r.str("program"), topology=topology, slices=slices, buffers=buffers,
            executables=executables, inputs=r.ints("inputs"), outputs=r.ints("outputs"), islands=islands,
            subgraphs=subgraphs, host_steps=host_steps,
            peak_bytes={k: r.sub(v, f"peak_bytes.{k}", list).ints_of(v)
                        for k, v in r.get("peak_bytes", dict, {}).items()},
            fused=fused, flops={k: r.sub(v, f"flops.{k}", int).value for k, v in r.get("flops", dict, {}).items()},
            donated=r.ints("donated") if "donated" in value else ())
        plan.validate(where)
        return plan

    @staticmethod
    def from_json(text: str) -> "ProgramPlan":
        """Parses and validates `to_json` output."""
        try:
            value = json.loads(text)
        except RecursionError:
            raise PlanError("plan: JSON nested too deeply") from None
        except ValueError as e:
            raise PlanError(f"plan: not JSON: {e}") from None
        return ProgramPlan.from_python(value)

    # -- validation ---------------------------------------------------------

    def validate(self, where: str = "plan") -> None:
        """Checks that the plan can run; raises PlanError naming the first step or buffer at fault."""
        topology = self.topology
        for name, s in self.slices.items():
            if s.island not in {i.name for i in topology.islands}:
                raise PlanError(f"{where}: slice {name} is on unknown island '{s.island}'")
            island = topology.island(s.island)
            if len(s.devices) % 2 or any(not 0 <= b < e <= island.num_devices for b, e in s.ranges):
                raise PlanError(f"{where}: slice {name}: device ranges {list(s.devices)} are not within "
                                f"{s.island}'s {island.num_devices} devices")
            if len(s.shape) != len(s.axes) or any(n < 1 for n in s.shape) or \
                    math.prod(s.shape) != sum(e - b for b, e in s.ranges):
                raise PlanError(f"{where}: slice {name}: mesh {list(s.shape)} over axes {list(s.axes)} does not "
                                f"match its devices")
        for b in self.buffers.values():
            what = f"{where}: buffer {b.id}"
            if b.dtype not in ELEMENT_BYTES:
                raise PlanError(f"{what}: unknown element type '{b.dtype}'", buffer=b.id)
            if any(d < 0 for d in b.shape) or math.prod(b.shape) > MAX_ELEMENTS:
                raise PlanError(f"{what}: shape {list(b.shape)} is negative or larger than {MAX_ELEMENTS} elements",
                                buffer=b.id)
            if b.slice is not None and len(b.sharding) != len(b.shape):
                raise PlanError(f"{what}: sharding has {len(b.sharding)} entries for {len(b.shape)} dimensions",
                                buffer=b.id)
            if zero_size(b.shape) and any(b.sharding):
                raise PlanError(f"{what}: shape {list(b.shape)} has no elements but is sharded: a zero-size buffer "
                                f"is replicated", buffer=b.id)
            ways = 1
            if b.slice is not None:
                placement = self.slices.get(b.slice)
                if placement is None:
                    raise PlanError(f"{what}: unknown slice '{b.slice}'", buffer=b.id)
                sizes = dict(zip(placement.axes, placement.shape))
                sharding = Sharding.from_python(b.sharding)
                problems = sharding.problems(b.shape, sizes)
                if problems:
                    raise PlanError(f"{what}: {problems[0]} (slice {b.slice})", buffer=b.id)
                ways = sharding.ways(sizes)
            expected = math.prod(b.shape) * ELEMENT_BYTES[b.dtype] // ways
            if b.bytes_per_device != expected:
                raise PlanError(f"{what}: bytes_per_device is {b.bytes_per_device}, but its shape, type and "
                                f"sharding give {expected}", buffer=b.id)
        for ids, what in ((self.inputs, "input"), (self.outputs, "output")):
            for b in ids:
                if b not in self.buffers:
                    raise PlanError(f"{where}: {what} buffer {b} is not declared")
        if len(set(self.inputs)) != len(self.inputs):
            raise PlanError(f"{where}: input buffer {next(b for b in self.inputs if self.inputs.count(b) > 1)} is "
                            f"listed twice: each argument is a buffer of its own")
        for b in self.donated:
            if b not in self.inputs:
                raise PlanError(f"{where}: donated buffer {b} is not an input of the program")
        for name, flops in self.flops.items():
            if isinstance(flops, bool) or not isinstance(flops, int) or not 0 <= flops <= MAX_FLOPS:
                raise PlanError(f"{where}: flops of executable '{name}' are {_number(flops)}, not an integer from 0 "
                                f"to 2**63 - 1")
        self._validate_steps(where)

    def _validate_steps(self, where: str) -> None:
        steps = {}
        for island, island_steps in self.islands.items():
            if island not in {i.name for i in self.topology.islands}:
                raise PlanError(f"{where}: steps for unknown island '{island}'")
            for s in island_steps:
                if s.id in steps:
                    raise PlanError(f"{where}: step id {s.id} is used twice")
                if s.on_host:
                    raise PlanError(f"{where}: step {s.id}: a '{s.kind}' step runs on the host, not on {island}",
                                    step=s.id)
                steps[s.id] = (island, s)
        for s in self.host_steps:
            if s.id in steps:
                raise PlanError(f"{where}: step id {s.id} is used twice")
            steps[s.id] = (None, s)
        # Where each buffer is written: program inputs first, then by steps.
        written: dict[int, tuple[str | None, int]] = {b: (self.island_of(b), -1) for b in self.inputs}
        for step_id, (island, s) in steps.items():
            for b in (*s.consumed(), *s.produced()):
                if b not in self.buffers:
                    raise PlanError(f"{where}: step {step_id} ({s.kind}) names buffer {b}, which is not declared",
                                    step=step_id)
            for b in s.produced():
                if island is not None and self.island_of(b) != island:
                    raise PlanError(f"{where}: step {step_id} ({s.kind}) on {island} writes buffer {b}, which lives "
                                    f"on {self.island_of(b) or 'the host'}", step=step_id)
                if b in written:
                    raise PlanError(f"{where}: buffer {b} is written twice (step {step_id})", step=step_id)
                written[b] = (island, step_id)
            for a in s.after:
                if a not in steps:
                    raise PlanError(f"{where}: step {step_id} comes after step {a}, which does not exist", step=step_id)
            if isinstance(s, Launch):
                if s.slice not in self.slices or self.slices[s.slice].island != island:
                    raise PlanError(f"{where}: step {step_id} launches on slice '{s.slice}', not one of {island}",
                                    step=step_id)
                if s.executable not in self.executables and s.executable not in self.fused:
                    raise PlanError(f"{where}: step {step_id} launches unknown executable '{s.executable}'",
                                    step=step_id)
                axes = set(self.slices[s.slice].axes)
                for call in self.fused[s.executable].calls if s.executable in self.fused else ():
                    if call.callee not in self.executables:
                        raise PlanError(f"{where}: step {step_id}: fused executable '{s.executable}' calls unknown "
                                        f"executable '{call.callee}'", step=step_id)
                    if call.in_shardings and (len(call.in_shardings) != len(call.operands) or not all(
                            a in axes for sharding in call.in_shardings for dim in sharding for a in dim)
                            or any(Sharding.from_python(sharding).repeated_axes() for sharding in call.in_shardings)):
                        raise PlanError(f"{where}: step {step_id}: fused executable '{s.executable}' constrains "
                                        f"@{call.callee}'s operands to shardings that slice '{s.slice}' cannot hold",
                                        step=step_id)
            if isinstance(s, (Send, Recv)):
                if s.peer not in {i.name for i in self.topology.islands} or s.peer == island:
                    raise PlanError(f"{where}: step {step_id} ({s.kind}) has peer '{s.peer}', not another island",
                                    step=step_id)
            if isinstance(s, Move):
                src, dst = self.buffers.get(s.src_buffer), self.buffers.get(s.dst_buffer)
                if src is None or dst is None or (src.shape, src.dtype) != (dst.shape, dst.dtype):
                    types = [f"{b.dtype}{list(b.shape)}" if b is not None else "undeclared" for b in (src, dst)]
                    raise PlanError(f"{where}: step {step_id} ({s.kind}) moves buffer {s.src_buffer} ({types[0]}) "
                                    f"into buffer {s.dst_buffer} ({types[1]}): a move keeps its shape and dtype",
                                    step=step_id)
                if s.bytes != dst.bytes_per_device:     # (a send and its recv: the same dst_buffer)
                    raise PlanError(f"{where}: step {step_id} ({s.kind}): its 'bytes' is {_number(s.bytes)}, but "
                                    f"buffer {s.dst_buffer} has {dst.bytes_per_device} bytes per device", step=step_id)
            if isinstance(s, Branch):
                pred = self.buffers[s.pred_buffer]
                if pred.shape or pred.dtype.startswith("complex"):
                    raise PlanError(f"{where}: step {step_id} (cond) reads buffer {s.pred_buffer} "
                                    f"({pred.dtype}{list(pred.shape)}) as its predicate, which must be a scalar of "
                                    f"a boolean, integer or float type", step=step_id)
        readers: dict[int, list[int]] = {}
        # A send and its recv agree on both buffers and both islands: (to, dst_buffer, src_buffer, from).
        sends_of: dict[tuple, list[int]] = {}
        received = set()
        for step_id, (island, s) in steps.items():
            for b in s.reads():
                readers.setdefault(b, []).append(step_id)
            if isinstance(s, Send):
                sends_of.setdefault((s.peer, s.dst_buffer, s.src_buffer, island), []).append(step_id)
            elif isinstance(s, Recv):
                received.add((island, s.dst_buffer, s.src_buffer, s.peer))
        for step_id, (island, s) in steps.items():
            for b in s.consumed():
                if b not in written:
                    raise PlanError(f"{where}: step {step_id} ({s.kind}) reads buffer {b}, which nothing writes",
                                    step=step_id)
                home, producer = written[b]
                # (a cond's result, which a host step writes, is on whichever slice its branch left it)
                if island is not None and home != island and (home is not None or producer < 0):
                    lives = home or ("the host: a program argument with no home slice (pw-insert-transfers gives "
                                     "each one)")
                    raise PlanError(f"{where}: step {step_id} ({s.kind}) on {island} reads buffer {b}, "
                                    f"which lives on {lives}", step=step_id)
            if isinstance(s, Recv):
                sends = sends_of.get((island, s.dst_buffer, s.src_buffer, s.peer), ())
                if len(sends) != 1 or sends[0] not in s.after:
                    raise PlanError(f"{where}: step {step_id} (recv) of buffer {s.dst_buffer} has no matching send "
                                    f"of buffer {s.src_buffer} from {s.peer} in its 'after'", step=step_id)
            if isinstance(s, Send) and (s.peer, s.dst_buffer, s.src_buffer, island) not in received:
                raise PlanError(f"{where}: step {step_id} (send) of buffer {s.src_buffer} has no matching recv of "
                                f"buffer {s.dst_buffer} on {s.peer}", step=step_id)
            for b in s.frees():
                early = sorted(r for r in readers.get(b, ()) if r not in s.after)
                if early or b in self.outputs:
                    raise PlanError(f"{where}: step {step_id} ({s.kind}) frees buffer {b} " + (
                        f"without waiting for step {early[0]}, which reads it" if early else
                        "of the program's results"), step=step_id)
        for b in self.outputs:
            if b not in written:
                raise PlanError(f"{where}: output buffer {b} is neither an input nor written by a step")
        # Each island's list must be a valid order of the dependencies among its own steps.
        for island, island_steps in self.islands.items():
            position = {s.id: i for i, s in enumerate(island_steps)}
            for i, s in enumerate(island_steps):
                late = sorted(a for a in self.dependencies[s.id] if position.get(a, -1) > i)
                if late:
                    raise PlanError(f"{where}: on {island}, step {s.id} ({s.kind}) is ordered before step "
                                    f"{late[0]}, which it depends on", step=s.id)
        # The islands run their lists in order: with that order, the dependencies must still have no cycle.
        waits = {sid: set(before) for sid, before in self.dependencies.items()}
        for island_steps in self.islands.values():
            for before, s in zip(island_steps, island_steps[1:]):
                waits[s.id].add(before.id)
        cycle = _cycle(waits)
        if cycle:
            raise PlanError(f"{where}: steps wait for each other ({' -> '.join(map(str, cycle))}): the island "
                            f"orders and the dependencies deadlock", step=cycle[1])
        for island, flat in self.peak_bytes.items():
            if island not in self.islands or len(flat) % 3 or any(v < 0 for v in flat):
                raise PlanError(f"{where}: peak_bytes of '{island}' are not (begin, end, bytes) triples of an "
                                f"island with steps")
            devices = self.topology.island(island).num_devices
            for begin, end in zip(flat[0::3], flat[1::3]):
                if not begin < end <= devices:
                    raise PlanError(f"{where}: peak_bytes of '{island}' name devices {begin}..{end}, not a range "
                                    f"of its {devices} devices")


def _number(value: Any) -> str:
    """Returns `value` as a message shows it: a number of more than 20 digits by its count of digits."""
    text = str(value)
    return text if len(text) <= 20 else f"a {len(text)}-digit number"


def _cycle(waits: dict[int, set[int] | frozenset[int]]) -> list[int] | None:
    """Returns a cycle of `waits` (step -> the steps it waits for) as the step ids in the order they would
    run, each waiting for the one before, from the smallest id back to it; None if there is none."""
    waiting = {sid: {b for b in before if b in waits} for sid, before in waits.items()}
    users: dict[int, list[int]] = {}
    for sid, before in waiting.items():
        for b in before:
            users.setdefault(b, []).append(sid)
    ready = [sid for sid, before in waiting.items() if not before]
    left = set(waiting)
    while ready:
        sid = ready.pop()
        left.discard(sid)
        for user in users.get(sid, ()):
            waiting[user].discard(sid)
            if not waiting[user]:
                ready.append(user)
    if not left:
        return None
    path, seen, step = [], {}, min(left)
    while step not in seen:                  # every step left waits for one left: the walk comes back
        seen[step] = len(path)
        path.append(step)
        step = min(waiting[step])
    ring = path[seen[step]:][::-1]
    first = ring.index(min(ring))
    ring = ring[first:] + ring[:first]
    return [*ring, ring[0]]
