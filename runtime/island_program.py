"""Island programs: a plan's steps for one island, compiled to a flat instruction list.

All host work a step needs (its compiled executable, the shardings of its
outputs, its buffer slots, its DCN link) is done once, when the program is
built; executing an instruction then resolves slot indices and makes one
call. A run's buffers live in a list of slots, one per buffer of the island;
`Free` instructions clear slots after their last use. There are no futures
and no locks per buffer: a `Recv` whose value has not arrived tells the
executor to park the run (see `island.py`), which resumes when it arrives.

One instruction class per kind of plan step:

    LaunchInstruction  slots[outputs] = executable(*slots[inputs])
    CopyInstruction    slots[dst] = device_put(slots[src], destination sharding), or its shards
                       assembled where they are, or on the host for the launch that reads it
    SendInstruction    hand slots[src] to the peer island (DCN)
    RecvInstruction    continue only once slots[dst] has arrived
    FreeInstruction    slots[buffers] = None (folded into the launch or copy before it, if any)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

from pathways_mlir.dialect.memory_plan import donated_at
from pathways_mlir.dialect.plan import ProgramPlan
from pathways_mlir.dialect.plan_steps import Copy, Free, Launch, Recv, Send, Step

from .executables import direct_call, named_sharding, numpy_dtype
from .transfers import copy_to, fresh_copy, in_place_assembly, shards_in_place, through_host

if TYPE_CHECKING:
    from .island import Island, IslandRun


class LaunchInstruction:
    """Runs a compiled executable on slots, writing its results to slots, then clears the slots of the frees
    folded into it. A tracked launch keeps one of its results in the run's `tracked` list, `computed` (an
    output the executable computes, not an argument a fused one returns as it is), or all of them if it has
    none: the results of one call of an executable become ready together (one execution on each device of
    its mesh, over which every result is laid out), so one says when the launch's device work is over.
    Keeping all of them kept every result of the runs in flight alive, and a pytree of hundreds of leaves
    made them so many objects for the garbage collector to promote and traverse."""

    __slots__ = ("call", "inputs", "outputs", "label", "devices", "track", "clears", "only_input", "only_output",
                 "computed", "collective")

    def __init__(self, call: Callable, inputs: tuple[int, ...], outputs: tuple[int, ...], label: str, devices,
                 computed: int | None = 0, collective: bool = False):
        self.call, self.inputs, self.outputs, self.label, self.devices = call, inputs, outputs, label, devices
        self.collective = collective         # the executable runs a collective among its devices
        self.computed = computed if outputs else None
        self.track = False
        self.clears: tuple[int, ...] = ()
        # The slot of a launch's one input or output, else None: most launches have one of each, and reading
        # it alone saves building a list and a loop per launch (a tenth of a one-device launch's host time).
        self.only_input = inputs[0] if len(inputs) == 1 else None
        self.only_output = outputs[0] if len(outputs) == 1 else None

    def execute(self, island: "Island", run: "IslandRun") -> bool:
        slots = run.slots
        if self.only_input is not None:
            results = self.call(slots[self.only_input])
        else:
            results = self.call(*[slots[i] for i in self.inputs])
        if self.only_output is not None:
            slots[self.only_output] = results[0]
        else:
            for slot, array in zip(self.outputs, results):
                slots[slot] = array
        for slot in self.clears:
            slots[slot] = None
        if self.track:
            if self.computed is not None:
                run.tracked.append(results[self.computed])
            else:
                run.tracked.extend(results)
        if island.tracer is not None:
            island.trace(self.label, "launch", self.devices, results)
        return True


class CopyInstruction:
    """Moves (and reshards) a slot's array to another slice of the island (ICI), then clears the slots of the
    frees folded into it. `in_place`: the source is the run's own and every destination device holds its
    shard already, so the array is assembled from them by this function (`in_place_assembly`; no copy).
    `fresh`: the destination is a program result whose source a later step reads or the caller holds (a program
    argument or result), so it is copied into buffers of its own (`fresh_copy`).
    `to_host`: JAX's move would go through the host (`through_host`) and the destination's one reader is a
    launch that places a host array itself (`ProgramPlan.launch_placed`), so the array is fetched to the host and
    handed to that launch as it is."""

    __slots__ = ("src", "dst", "sharding", "label", "devices", "track", "clears", "in_place", "to_host", "fresh")

    def __init__(self, src: int, dst: int, sharding, label: str, devices, in_place: Callable | None = None,
                 to_host: bool = False, fresh: bool = False):
        self.src, self.dst, self.sharding, self.label, self.devices = src, dst, sharding, label, devices
        self.in_place, self.to_host, self.fresh = in_place, to_host, fresh
        self.track = False
        self.clears: tuple[int, ...] = ()

    def execute(self, island: "Island", run: "IslandRun") -> bool:
        array = run.slots[self.src]
        if self.in_place is not None:
            moved = self.in_place(array)
        elif self.to_host:
            moved = np.asarray(array)        # waits for it, as JAX's move through the host does
        elif self.fresh:
            moved = fresh_copy(array, self.sharding)
        else:
            moved = copy_to(array, self.sharding)
        run.slots[self.dst] = moved
        for slot in self.clears:
            run.slots[slot] = None
        if self.to_host:                     # on the host already: no device work of it to await
            if island.tracer is not None:
                island.trace(self.label, "copy", self.devices, [])
            return True
        if self.track:
            run.tracked.append(moved)
        if island.tracer is not None:
            island.trace(self.label, "copy", self.devices, [moved])
        return True


class SendInstruction:
    """Hands a slot's array to a peer island, which receives it as `peer_buffer`; `kept`: the array is a program
    argument or result, which a later run may donate (`IslandExecutor.send`)."""

    __slots__ = ("src", "peer", "peer_buffer", "nbytes", "link", "kept")

    def __init__(self, src: int, peer: str, peer_buffer: int, nbytes: int, link, kept: bool):
        self.src, self.peer, self.peer_buffer, self.nbytes, self.link = src, peer, peer_buffer, nbytes, link
        self.kept = kept

    def execute(self, island: "Island", run: "IslandRun") -> bool:
        island.send(run, self.peer, self.peer_buffer, run.slots[self.src], self.nbytes, self.link, self.kept)
        return True


class RecvInstruction:
    """Continues only once the peer's array is in the slot; otherwise the run parks here."""

    __slots__ = ("dst", "track", "what")

    def __init__(self, dst: int, what: str = ""):
        self.dst = dst
        self.track = False
        self.what = what        # the value awaited, by name (for status reports)

    def execute(self, island: "Island", run: "IslandRun") -> bool:
        array = run.slots[self.dst]
        if array is None:
            return False
        if self.track:
            run.tracked.append(array)
        return True


class FreeInstruction:
    """Drops the island's references to arrays after their last use."""

    __slots__ = ("slots",)

    def __init__(self, slots: tuple[int, ...]):
        self.slots = slots

    def execute(self, island: "Island", run: "IslandRun") -> bool:
        for slot in self.slots:
            run.slots[slot] = None
        return True


Instruction = LaunchInstruction | CopyInstruction | SendInstruction | RecvInstruction | FreeInstruction


@dataclass(frozen=True)
class IslandLayout:
    """Where a plan's buffers live on one island: a slot per buffer, and home shardings."""

    slot: dict[int, int]                 # buffer id -> slot index
    shardings: dict[int, object]         # buffer id -> its home NamedSharding
    outputs: tuple[tuple[int, int], ...]  # (buffer, slot) of the program's results on this island
    devices: int                         # how many of the island's devices the plan's slices here cover
    launched: frozenset[int]             # buffers whose one reader, a launch, places NumPy (`plan.launch_placed`)
    one_device: dict[int, object]        # program inputs, not donated, whose home is one device -> that device
    # (buffer, slot) of the results that are program inputs, not donated, returned as they are: the caller's
    # array (or a placed copy of it), which the island copies, as `jax.jit` returns a new array (`_finish`).
    passed_through: tuple[tuple[int, int], ...]
    # Results the run itself still holds for a later step here or as the caller's argument: what a reader takes
    # of one while the run is under way here is a copy (`Island.fetch`, `Island._kept`), as `jax.jit` leaves
    # its later computations their own values, else deleting or donating it took a later launch's argument.
    shared_results: frozenset[int]
    # Such an input -> the latest sharding object of an argument found on that device (see `on_home`).
    found_home: dict[int, object] = field(default_factory=dict, compare=False)

    def on_home(self, buffer: int, sharding) -> bool:
        """Whether an array of `sharding` lies on the one device of input `buffer`'s home (`one_device`), in its
        memory kind. The latest sharding object found there is kept per input and known at once the next time:
        the arrays a loop passes (the same argument, or a launch's results) share one, and asking a sharding for
        its devices and memory kind costs about 1 us."""
        if self.found_home.get(buffer) is sharding:
            return True
        if sharding.device_set == {self.one_device[buffer]} and \
                sharding.memory_kind == self.shardings[buffer].memory_kind:
            self.found_home[buffer] = sharding
            return True
        return False

    @staticmethod
    def build(island: "Island", plan: ProgramPlan) -> "IslandLayout":
        """Numbers the island's buffers and builds their home shardings (once per plan)."""
        mine = [b for b in plan.buffers if plan.island_of(b) == island.name]
        slot = {b: i for i, b in enumerate(mine)}
        shardings = {b: named_sharding(island.mesh(plan, plan.buffers[b].slice), plan.buffers[b].sharding)
                     for b in mine}
        covered = {d for s in plan.slices.values() if s.island == island.name for d in s.device_ids()}
        one_device = {b: next(iter(shardings[b].device_set)) for b in plan.inputs
                      if b in slot and b not in plan.donated and len(shardings[b].device_set) == 1}
        outputs = tuple((b, slot[b]) for b in plan.distinct_outputs if b in slot)
        passed_through = tuple((b, i) for b, i in outputs if b in plan.inputs and b not in plan.donated)
        readers = plan.readers(island.name)
        shared_results = frozenset(b for b, _ in outputs if b in readers or b in plan.inputs)
        return IslandLayout(slot, shardings, outputs, len(covered), plan.launch_placed(island.name), one_device,
                            passed_through, shared_results)


def _awaited(plan: ProgramPlan, recv: Recv) -> str:
    """Names what a recv waits for: the peer's send and the step that produced the value sent."""
    sender = next((s for s in plan.islands.get(recv.peer, ()) if isinstance(s, Send) and
                   s.dst_buffer == recv.dst_buffer), None)
    producer = next((s for s in plan.islands.get(recv.peer, ()) if recv.src_buffer in s.produced()), None)
    made_by = "" if producer is None else f", the result of {producer.kind} step {producer.id}" + (
        f" '{producer.label or getattr(producer, 'executable', '')}'" if isinstance(producer, Launch) else "")
    send = "" if sender is None else f" (send step {sender.id})"
    return f"buffer {recv.dst_buffer} from {recv.peer}{send}: its buffer {recv.src_buffer}{made_by}"


def _computed_result(plan: ProgramPlan, launch: Launch) -> int | None:
    """The position of a result the launch's executable computes: its first, or for a fused executable the
    first that is not one of its arguments returned as it is; None if there is none."""
    fused = plan.fused.get(launch.executable)
    if fused is None:
        return 0
    return next((i for i, value in enumerate(fused.results) if value >= len(launch.inputs)), None)


def compile_steps(island: "Island", plan: ProgramPlan, layout: IslandLayout,
                  steps: tuple[Step, ...]) -> tuple[Instruction, ...]:
    """Compiles steps into instructions (compiling executables and building shardings now). A free right
    after a launch or a copy is folded into it.

    The last instruction that writes on each slice keeps its arrays (a
    launch: one of its results) in the run's `tracked` list: once they are
    ready, every device of the island has finished the run's work, which is
    when its memory is given back.
    """
    instructions: list[Instruction] = []
    last_on_slice: dict[str, Instruction] = {}
    slot = layout.slot
    # A donated input goes to XLA at its last reader, as `jax.jit` gives it its donated arguments: XLA writes a
    # result into it where one fits (not only the one laid out as it, `reuses`), and JAX deletes the array then.
    donated = donated_at(plan, island.name)
    # Arrays only this run holds, which no code but its instructions can reach: launch results that are not
    # program results (a program input or result is the caller's, who may donate it later, and a copy may
    # return its source). A copy may share their shards (in place), and a launch reading only such arrays
    # calls XLA's executable directly (`direct_call`).
    owned = {b for s in steps if isinstance(s, Launch) for b in s.outputs} - set(plan.outputs)
    # A program result is the caller's as soon as it is made (a handle reads it while its run still executes
    # here, parked on a recv say), and the caller may delete or donate it. Copied to a result, an array another
    # step still reads goes to new buffers: assembled in place, or moved by JAX (which returns an array already
    # on the sharding as it is, and reuses a shard already on its device), the result shared them, the caller's
    # deletion reached that step's argument, and XLA crashed the process on an array some of whose shards
    # were deleted. A result copied from the caller's argument or another result goes to new buffers too: moved
    # onto an equal sharding it was that same array, and deleting or donating one took the other.
    readers = plan.readers(island.name)
    callers = set(plan.inputs) | set(plan.outputs)
    for step in steps:
        if isinstance(step, Launch):
            placement = plan.slices[step.slice]
            donate = tuple(i for i, b in enumerate(step.inputs) if b in donated.get(step.id, ()))
            call = island.cache.get(step.executable, plan, island.mesh(plan, step.slice), step.inputs,
                                    step.outputs, donate)
            collective = island.cache.collective(call)
            if step.inputs and owned.issuperset(step.inputs):
                call = direct_call(call)
            instructions.append(LaunchInstruction(call, tuple(slot[b] for b in step.inputs),
                                                  tuple(slot[b] for b in step.outputs),
                                                  step.label or step.executable, placement.device_ids(),
                                                  _computed_result(plan, step), collective))
            last_on_slice[step.slice] = instructions[-1]
        elif isinstance(step, Copy):
            dst = plan.buffers[step.dst_buffer]
            src_sharding, dst_sharding = layout.shardings[step.src_buffer], layout.shardings[step.dst_buffer]
            fresh = step.dst_buffer in plan.outputs and (
                step.src_buffer in callers or len(readers.get(step.src_buffer, ())) > 1)
            in_place = in_place_assembly(src_sharding, dst_sharding, dst.shape, numpy_dtype(dst.dtype)) if (
                step.src_buffer in owned and not fresh and shards_in_place(src_sharding, dst_sharding, dst.shape)
            ) else None
            to_host = in_place is None and step.dst_buffer in layout.launched and through_host(
                src_sharding, dst_sharding, dst.shape)
            instructions.append(CopyInstruction(slot[step.src_buffer], slot[step.dst_buffer], dst_sharding,
                                                step.label or "copy", plan.slices[dst.slice].device_ids(),
                                                in_place, to_host, fresh))
            last_on_slice[dst.slice] = instructions[-1]
        elif isinstance(step, Send):
            # The cluster's own link (--emulate-dcn sleeps for its time), not the figures a plan file declares.
            instructions.append(SendInstruction(slot[step.src_buffer], step.peer, step.dst_buffer, step.bytes,
                                                island.device_map.topology.link(island.name, step.peer)[1],
                                                step.src_buffer in plan.inputs or step.src_buffer in plan.outputs))
        elif isinstance(step, Recv):
            instructions.append(RecvInstruction(slot[step.dst_buffer], _awaited(plan, step)))
            last_on_slice[plan.buffers[step.dst_buffer].slice] = instructions[-1]
        elif isinstance(step, Free):
            cleared = tuple(slot[b] for b in step.buffers)
            if instructions and isinstance(instructions[-1], (LaunchInstruction, CopyInstruction)):
                instructions[-1].clears += cleared       # folded: one instruction fewer to execute
            else:
                instructions.append(FreeInstruction(cleared))
        else:
            raise ValueError(f"island {island.name} cannot execute a '{step.kind}' step")
    for instruction in last_on_slice.values():
        instruction.track = True
    return tuple(instructions)
