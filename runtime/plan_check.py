"""Plans are untrusted input: what their compiled functions may do, checked before any is compiled.

A plan's executables are `jax.export` serialisations, and XLA trusts what
they say: a custom call runs native code with the buffers the module
declares. A plan from a file or another process could call a host callback
(`xla_ffi_python_cpu_callback` runs whatever the serialised callback names),
or a LAPACK kernel with results declared smaller than what it writes, and
crash or corrupt the process that runs it. `check_plan` refuses, with one
`PlanError` line naming the executable and the target or buffer:

- ops outside `ALLOWED_DIALECTS` (MHLO's `custom_call` would go unchecked),
  and ops that wait for the host (`HOST_OPS`: infeed, outfeed, send and
  recv), whose launch would never end;
- custom calls outside `ALLOWED_TARGETS`: the targets JAX guarantees stable
  (`jax.export`'s compatibility list) that run on the CPU without a host
  callback, and whose buffers XLA checks (its own) or this module does
  (LAPACK's);
- LAPACK calls whose operand and result types are not those the kernel
  reads and writes for its operand's shape (`_LAPACK`; the modes that change
  a result's shape, `gesdd`'s and `trsm`'s, are read from the call);
- executables whose exported argument or result avals (shape, dtype) differ
  from the buffers the plan's launches give and take (a fused one given
  another number of arguments than it declares), or that were exported
  for another number of devices than one (unsharded semantics) or their
  launch's slice has (a function of JAX's explicit sharding mode, whose
  argument types name its slice's axes);
- fused executables that constrain a call's operand to a sharding that
  cannot lay it out (`Sharding.problems`: its rank, an axis named twice, a
  dimension it does not divide), which XLA would refuse only when the
  launch compiles, at the run;
- a static peak (`peak_bytes`) below what the island's own steps hold on
  some device (`dialect/memory_plan.peak`, the analysis `pw-plan-memory`
  wrote it with): admission reserves the declared peak, so an understated
  one would let runs past the devices' memory.

An executable that calls back to the host is not serialised at all: its
`pw.export` names a function kept in the process that traced it
(`runtime/executables.py`), which is that process's own code and is checked
for its avals only; in any other process the name is unknown and the plan
is refused.

The walk reads every operation of the module with JAX's own MLIR bindings
(`jax.extend.mlir`), nested regions and every function included.
"""

from __future__ import annotations

import base64
import math

from pathways_mlir.dialect.memory_plan import peak
from pathways_mlir.dialect.plan import PlanError, ProgramPlan
from pathways_mlir.dialect.plan_steps import Launch
from pathways_mlir.dialect.sharding import Sharding

from .executables import InProcessFunction, is_in_process, kept_in_process, numpy_dtype

# Targets XLA itself implements while compiling (no kernel runs with the module's buffers). XLA checks an
# `ApproxTopK` call's operand, result and comparator types against each other and its `top_k` before it
# expands the call into a sort (`jax.lax.approx_max_k` and `approx_min_k` off TPU): a call that declares
# other results fails to compile.
_XLA_TARGETS = ("Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "annotate_device_placement",
                "ApproxTopK")


def _lapack(*families: str) -> dict[str, str]:
    """Maps each `lapack_<prefix><family>_ffi` target to its family, for the real and complex prefixes."""
    out = {}
    for family in families:
        real, complex_ = family.split("/") if "/" in family else (family, family)
        for prefix, name in (("s", real), ("d", real), ("c", complex_), ("z", complex_)):
            out[f"lapack_{prefix}{name}_ffi"] = real
    return out


_LAPACK_TARGETS = _lapack("potrf", "geqrf", "orgqr/ungqr", "syevd/heevd", "geev", "gesdd", "getrf",
                          "sytrd/hetrd", "gehrd", "gees", "trsm", "gtsv")
ALLOWED_TARGETS = frozenset((*_XLA_TARGETS, *_LAPACK_TARGETS))

# The dialects whose ops a plan's module may hold: what `jax.export` writes, and CHLO's and Shardy's ops, which
# XLA expands or reads while compiling. An op of any other dialect JAX registers (MHLO's `custom_call`, which
# XLA compiles as StableHLO's, and its `infeed`) is refused: the checks below read StableHLO's ops only.
ALLOWED_DIALECTS = frozenset(("builtin", "func", "stablehlo", "chlo", "sdy"))
# Ops that wait for the host to feed or read them, which nothing does: a launch of one never ends (XLA:CPU
# blocks in `infeed` and `outfeed` forever) and holds its island.
HOST_OPS = frozenset(("stablehlo.infeed", "stablehlo.outfeed", "stablehlo.send", "stablehlo.recv"))


def check_plan(plan: ProgramPlan, where: str = "plan") -> None:
    """Raises PlanError if an executable of `plan` (or of a branch plan) makes a custom call outside
    `ALLOWED_TARGETS`, a LAPACK call with the wrong types, or takes or returns other avals than the plan's
    buffers, or if its static peak is below what its steps hold."""
    _check_peaks(plan, where)
    exported = {name: _deserialize(name, blob, where) for name, blob in plan.executables.items()
                if blob and not is_in_process(blob)}
    for name, export in exported.items():
        _check_module(name, export, where)
    exported.update((name, _kept(name, blob, where)) for name, blob in plan.executables.items()
                    if is_in_process(blob))
    for steps in plan.islands.values():
        for step in steps:
            if isinstance(step, Launch):
                _check_launch(plan, step, exported, where)
    for step in plan.host_steps:
        check_plan(step.then_plan, f"{where}.host_steps[{step.id}].then")
        check_plan(step.else_plan, f"{where}.host_steps[{step.id}].else")


def _check_peaks(plan: ProgramPlan, where: str) -> None:
    """Raises PlanError if an island's declared peak is below, on some device, the bytes its steps hold
    (frees included, as `pw-plan-memory` computes it); a larger one only reserves more."""
    for island, steps in plan.islands.items():
        declared = plan.peak(island)
        needed = peak(plan, island, steps)
        if needed and not declared:
            raise PlanError(f"{where}: declares no peak_bytes for '{island}', whose steps hold {needed[2]} bytes on "
                            f"device {needed[0]}: a plan's peaks come from pw-plan-memory (the last pass of pw-lower)")
        for begin, end, nbytes in zip(needed[0::3], needed[1::3], needed[2::3]):
            covered = sorted((max(b, begin), min(e, end)) for b, e, n in declared
                             if n >= nbytes and b < end and e > begin)
            reached = begin
            for b, e in covered:
                if b > reached:
                    break
                reached = max(reached, e)
            if reached < end:
                raise PlanError(f"{where}: peak_bytes of '{island}' declare less than the {nbytes} bytes its steps "
                                f"hold on device {reached} (of {begin}..{end}): admission would reserve too little")


def refuse_kept_functions(plan: ProgramPlan, why: str) -> None:
    """Raises NotImplementedError in one line if `plan` (or a branch plan) launches a function kept in this
    process (one that calls back to the host), which islands elsewhere cannot run; `why` says where they are."""
    for name, blob in plan.executables.items():
        if is_in_process(blob):
            raise NotImplementedError(
                f"executable @{name} calls back to the host (jax.debug.print, jax.debug.callback, "
                f"jax.pure_callback or io_callback), which only islands in the process that traced it can run, "
                f"and {why}: run it on the embedded backend, or return the values and print them from the handles")
    for step in plan.host_steps:
        refuse_kept_functions(step.then_plan, why)
        refuse_kept_functions(step.else_plan, why)


def refuse_debug_checks(why: str) -> None:
    """Raises NotImplementedError in one line if JAX's `jax_debug_nans` or `jax_debug_infs` is on here: islands
    elsewhere (`why` says where) call their executables under their own process's JAX configuration, so a NaN
    would not fail the run, as it does on the embedded backend and under `jax.jit`."""
    import jax

    for flag in ("jax_debug_nans", "jax_debug_infs"):
        if getattr(jax.config, flag):
            raise NotImplementedError(
                f"{flag} is on, but {why}, under their own JAX configuration, so a run would not fail on a "
                f"NaN or inf: check for them on the embedded backend, or in the values the handles hold")


def _deserialize(name: str, blob: str, where: str):
    import jax

    try:
        data = base64.b64decode(blob, validate=True)
    except ValueError:                   # (binascii.Error)
        raise PlanError(f"{where}: executable @{name} is not base64 text, as a plan's executables are") from None
    try:
        return jax.export.deserialize(bytearray(data))
    except Exception as error:  # noqa: BLE001  (any failure to read untrusted bytes is the plan's fault)
        raise PlanError(f"{where}: executable @{name} is not a jax.export serialisation: its {len(data)} bytes "
                        f"do not read as one ({type(error).__name__})") from None


def _kept(name: str, blob: str, where: str) -> InProcessFunction:
    """The function kept in this process that executable `name` names (its code is this process's own trace,
    its host callbacks included); PlanError if this process traced no such function."""
    kept = kept_in_process(blob)
    if kept is None:
        raise PlanError(f"{where}: executable @{name} calls back to the host and was traced in another process: "
                        f"only the process that traced it runs it (on the embedded runtime)")
    return kept


def _avals(plan: ProgramPlan, buffers) -> list[tuple[tuple[int, ...], str]]:
    return [(tuple(plan.buffers[b].shape), numpy_dtype(plan.buffers[b].dtype).name) for b in buffers]


def _exported_avals(avals) -> list[tuple[tuple[int, ...], str]]:
    return [(tuple(a.shape), a.dtype.name) for a in avals]


def _check_launch(plan: ProgramPlan, step: Launch, exported: dict, where: str) -> None:
    """Checks that the executable (or each call of a fused one) takes and returns the launch's avals."""
    fused = plan.fused.get(step.executable)
    given = _avals(plan, step.inputs)
    if fused is None:
        calls, results = [(step.executable, tuple(range(len(given))), ())], (len(given),)
    elif fused.arguments != len(given):
        # Its calls' results are numbered after its arguments: given another number, each call would read
        # other values than those it was fused with, of the same avals as often as not, and run unnoticed.
        raise PlanError(f"{where}: step {step.id}: fused executable @{step.executable} has {fused.arguments} "
                        f"arguments, but the plan gives {len(given)}")
    else:
        calls, results = [(c.callee, c.operands, c.in_shardings) for c in fused.calls], fused.results
    placement = plan.slices[step.slice]
    sizes = dict(zip(placement.axes, placement.shape))
    values = list(given)
    for callee, operands, in_shardings in calls:
        export = exported.get(callee)
        if export is None:
            return   # no serialisation: the runtime says so (MissingExecutable) when it compiles the launch
        devices = getattr(export, "nr_devices", 1)     # (a function kept in process runs on any mesh)
        if devices not in (1, math.prod(placement.shape)):
            raise PlanError(f"{where}: step {step.id}: executable @{callee} was exported for {devices} devices, "
                            f"but the step launches it on slice @{step.slice} of {math.prod(placement.shape)}")
        if any(not 0 <= i < len(values) for i in operands):
            raise PlanError(f"{where}: step {step.id}: fused @{step.executable} calls @{callee} on a value it "
                            f"has not made")
        _compare(f"{where}: step {step.id}: executable @{callee}", "arguments",
                 _exported_avals(export.in_avals), [values[i] for i in operands])
        for position, (i, sharding) in enumerate(zip(operands, in_shardings)):
            problems = Sharding.from_python(sharding).problems(values[i][0], sizes)
            if problems:
                raise PlanError(f"{where}: step {step.id}: fused @{step.executable} constrains argument {position} "
                                f"of @{callee}: {problems[0]}")
        values.extend(_exported_avals(export.out_avals))
    if fused is None:
        produced = values[len(given):]
    elif any(not 0 <= i < len(values) for i in results):
        raise PlanError(f"{where}: step {step.id}: fused @{step.executable} returns a value it has not made")
    else:
        produced = [values[i] for i in results]
    _compare(f"{where}: step {step.id}: executable @{step.executable}", "results", produced,
             _avals(plan, step.outputs), step.outputs)


def _compare(what: str, kind: str, exported, declared, buffers=None) -> None:
    if len(exported) != len(declared):
        raise PlanError(f"{what} has {len(exported)} {kind}, but the plan gives {len(declared)}")
    for i, (have, want) in enumerate(zip(exported, declared)):
        if have != want:
            name = f"buffer {buffers[i]}" if buffers is not None else f"argument {i}"
            raise PlanError(f"{what}: {kind[:-1]} {i} is {_show(have)}, but the plan's {name} is {_show(want)}")


def _show(aval) -> str:
    return f"{aval[1]}{list(aval[0])}"


# -- the StableHLO walk ---------------------------------------------------------


def _check_module(name: str, export, where: str) -> None:
    """Walks every operation of the export's module; refuses a custom call it does not allow."""
    from jax.extend.mlir import ir
    from jax.interpreters import mlir

    with mlir.make_ir_context():      # the dialects JAX emits, registered
        try:
            module = ir.Module.parse(export.mlir_module())
        except Exception as error:  # noqa: BLE001  (unreadable bytes are the plan's fault)
            raise PlanError(f"{where}: executable @{name}: its StableHLO does not parse: "
                            f"{str(error).splitlines()[0][:200]}") from None
        pending = [module.operation]
        while pending:
            op = pending.pop()
            if op.name.partition(".")[0] not in ALLOWED_DIALECTS:
                raise PlanError(f"{where}: executable @{name} holds a '{op.name[:80]}' op: a plan's executables "
                                f"may hold ops of {', '.join(sorted(ALLOWED_DIALECTS))} only")
            if op.name in HOST_OPS:
                raise PlanError(f"{where}: executable @{name} holds a '{op.name}' op, which waits for the host: "
                                f"nothing feeds it, and its launch would never end")
            if op.name == "stablehlo.custom_call":
                _check_custom_call(name, op, where)
            for region in op.regions:
                for block in region:
                    pending.extend(o.operation for o in block)


def _check_custom_call(name: str, op, where: str) -> None:
    from jax.extend.mlir import ir

    try:
        target = ir.StringAttr(op.attributes["call_target_name"]).value
    except (KeyError, TypeError, ValueError):      # absent, unreadable, or not a string
        raise PlanError(f"{where}: executable @{name} makes a custom call without a readable target name") \
            from None
    if target not in ALLOWED_TARGETS:
        raise PlanError(f"{where}: executable @{name} makes a custom call to {target[:80]!r}, which is not "
                        f"allowed in a plan (allowed: LAPACK kernels, XLA's sharding annotations and ApproxTopK)")
    family = _LAPACK_TARGETS.get(target)
    if family is None:
        return
    try:
        operands = [_tensor(v.type) for v in op.operands]
        results = [_tensor(r.type) for r in op.results]
    except ValueError:
        raise PlanError(f"{where}: executable @{name} calls {target} on unranked or dynamic types") from None
    try:
        config = _backend_config(op)
    except (TypeError, ValueError):                # unreadable, or not a dictionary
        raise PlanError(f"{where}: executable @{name} calls {target} with an unreadable backend config") from None
    expected = _lapack_results(family, operands, config)
    if expected is None or results != expected:
        got = ", ".join(_show(t) for t in operands) + " -> " + ", ".join(_show(t) for t in results)
        raise PlanError(f"{where}: executable @{name} calls {target} with types ({got}) that are not the "
                        f"kernel's for its operands")


def _tensor(type_) -> tuple[tuple[int, ...], str]:
    from jax.extend.mlir import ir

    ranked = ir.RankedTensorType(type_)     # raises for an unranked or dynamic type: a malformed call
    if not ranked.has_static_shape:
        raise ValueError("a dynamic shape")
    return tuple(ranked.shape), str(ranked.element_type)


def _backend_config(op) -> dict[str, int]:
    from jax.extend.mlir import ir

    if "mhlo.backend_config" not in op.attributes:
        return {}
    config = ir.DictAttr(op.attributes["mhlo.backend_config"])
    # Looked up by name: an entry's `.attr` that the bindings cannot read aborts the process, where a lookup
    # raises TypeError.
    values = {name: config[name] for name in [config[i].name for i in range(len(config))]}
    return {name: ir.IntegerAttr(value).value for name, value in values.items() if isinstance(value, ir.IntegerAttr)}


_REAL = {"f32": "f32", "f64": "f64", "complex<f32>": "f32", "complex<f64>": "f64"}
_COMPLEX = {"f32": "complex<f32>", "f64": "complex<f64>"}


def _lapack_results(family: str, operands, config: dict[str, int]):
    """Returns the result types a LAPACK kernel writes for `operands`, or None if the operands themselves
    are not what it reads."""
    if family == "gtsv":     # dl, d, du: [batch, n]; b: [batch, n, nrhs]; writes all four and info
        if len(operands) != 4 or len(operands[0][0]) < 1:
            return None
        (*batch, size), t = operands[0]
        b_shape, b_type = operands[3]
        if any(o != operands[0] for o in operands[1:3]) or b_type != t or len(b_shape) != len(batch) + 2 \
                or tuple(b_shape[:-1]) != (*batch, size):
            return None
        return [*operands, (tuple(batch), "i32")]
    if not operands or len(operands[0][0]) < 2 or operands[0][1] not in _REAL:
        return None
    (*batch, m, n), t = operands[0]
    batch, k, i32 = tuple(batch), min(m, n), "i32"
    real, is_complex, square = _REAL[t], t not in _COMPLEX, m == n

    def of(*dims, dtype=t):
        return (batch + dims, dtype)

    def expect(count, results):
        return results if len(operands) == count else None

    if family == "potrf":
        return expect(1, [of(m, n), of(dtype=i32)]) if square else None
    if family == "geqrf":
        return expect(1, [of(m, n), of(k)])
    if family == "orgqr":
        if len(operands) != 2 or operands[1][1] != t or len(operands[1][0]) != len(batch) + 1:
            return None
        tau = operands[1][0][-1]
        return [of(m, n)] if operands[1][0][:-1] == batch and tau <= n <= m else None
    if family == "syevd":
        return expect(1, [of(n, n), of(n, dtype=real), of(dtype=i32)]) if square else None
    if family == "geev":
        if not square:
            return None
        if is_complex:
            return expect(1, [of(n), of(n, n), of(n, n), of(dtype=i32)])
        c = _COMPLEX[t]
        return expect(1, [of(n), of(n), of(n, n, dtype=c), of(n, n, dtype=c), of(dtype=i32)])
    if family == "gesdd":
        reduced = config.get("mode") == ord("S")
        u, vt = (of(m, k), of(k, n)) if reduced else (of(m, m), of(n, n))
        return expect(1, [of(m, n), of(k, dtype=real), u, vt, of(dtype=i32)])
    if family == "getrf":
        return expect(1, [of(m, n), of(k, dtype=i32), of(dtype=i32)])
    if family == "sytrd":
        return expect(1, [of(n, n), of(n, dtype=real), of(n - 1, dtype=real), of(n - 1), of(dtype=i32)]) \
            if square and n >= 1 else None
    if family == "gehrd":
        return expect(1, [of(n, n), of(n - 1), of(dtype=i32)]) if square and n >= 1 else None
    if family == "gees":
        if not square:
            return None
        values = [of(n)] if is_complex else [of(n), of(n)]
        return expect(1, [of(n, n), of(n, n), *values, of(dtype=i32), of(dtype=i32)])
    if family == "trsm":
        side = config.get("side")
        if len(operands) != 2 or side not in (ord("L"), ord("R")) or not square:
            return None
        b_shape, b_type = operands[1]
        if b_type != t or len(b_shape) != len(batch) + 2 or tuple(b_shape[:-2]) != batch:
            return None
        rows, cols = b_shape[-2:]
        return [operands[1]] if (rows if side == ord("L") else cols) == m else None
    return None
