"""Plans are untrusted input (runtime/plan_check.py): the crashing plans of issue 23 are refused at load.

Each hostile plan is the plan of a real one-launch program with its executable swapped for a hostile
`jax.export` serialisation: a host callback, a LAPACK SVD whose results are declared smaller than what
the kernel writes, and a function returning (8192, 8192) where the plan declares (8, 4). Without the
check the first two crash the process (SIGSEGV, heap corruption); with it `Runtime.load`, `pw-run` and
the service refuse each with one `PlanError` line naming the executable and the target or buffer, and
the service goes on serving. JAX's own LAPACK lowerings (every kernel family, batched, real and complex,
the modes that change shapes) pass. An op of a dialect JAX does not export (an MHLO custom call to the same
host callback, which crashed pw-run) or one that waits for the host (infeed, which hung it) is refused too.
"""

import base64
import dataclasses
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.dialect.plan import PlanError
from pathways_mlir.passes import lower, program_plans
from pathways_mlir.runtime.plan_check import _check_module, check_plan

ROOT = pathlib.Path(__file__).resolve().parents[1]
X = jax.ShapeDtypeStruct((8, 4), jnp.float32)


def double(x):
    return x * 2.0


def _plan(fn=double):
    """The plan of `fn` on one island: one launch, input f32[8, 4] (and for `double` the result too)."""
    runtime = pw.get_runtime()
    placed = pw.jit(fn, slice=pw.virtual_slice(1, axes="d", island="island0"), in_specs=P(), out_specs=P())
    lowered = placed.lower(np.ones((8, 4), np.float32))
    return program_plans(lower(lowered.module, runtime.resources.topology))[lowered.program]


def _with_executable(plan, fn, target=None):
    """`plan` with its one executable replaced by the export of `fn` (allowing custom call `target`)."""
    checks = [jax.export.DisabledSafetyCheck.custom_call(target)] if target else []
    exported = jax.export.export(jax.jit(fn), disabled_checks=checks)(X)
    (name,) = plan.executables
    return dataclasses.replace(plan, executables={name: base64.b64encode(exported.serialize()).decode()})


def host_callback(x):
    return jax.ffi.ffi_call("xla_ffi_python_cpu_callback", X)(x, index=np.uint64(1 << 40))


def svd_declared_small(x):
    """gesdd in mode 'A' writes u as [4096, 4096] (64 MiB); this call declares it [4096, 4]."""
    f32, m = jnp.float32, 4096
    results = (jax.ShapeDtypeStruct((m, 4), f32), jax.ShapeDtypeStruct((4,), f32),
               jax.ShapeDtypeStruct((m, 4), f32), jax.ShapeDtypeStruct((4, 4), f32),
               jax.ShapeDtypeStruct((), jnp.int32))
    tall = jnp.tile(x, (m // 8, 1))
    return jax.ffi.ffi_call("lapack_sgesdd_ffi", results)(tall, mode=np.uint8(ord("A")))[2][:8]


def too_big(x):
    return jnp.zeros((8192, 8192), jnp.float32) + x[0, 0]


HOSTILE = [
    (host_callback, "xla_ffi_python_cpu_callback", "makes a custom call to 'xla_ffi_python_cpu_callback'"),
    (svd_declared_small, "lapack_sgesdd_ffi", "calls lapack_sgesdd_ffi with types (f32[4096, 4] -> "
                                              "f32[4096, 4], f32[4], f32[4096, 4], f32[4, 4], i32[])"),
    (too_big, None, "result 0 is float32[8192, 8192], but the plan's buffer"),
]


@pytest.mark.parametrize("fn, target, message", HOSTILE, ids=[h[0].__name__ for h in HOSTILE])
def test_hostile_plans_are_refused_when_loaded(fn, target, message):
    plan = _with_executable(_plan(), fn, target)
    with pytest.raises(PlanError) as error:
        pw.get_runtime().load(plan)
    text = str(error.value)
    assert message in text and "executable @" in text and "\n" not in text, text


@pytest.mark.parametrize("fn, target, message", HOSTILE[:2], ids=[h[0].__name__ for h in HOSTILE[:2]])
def test_pw_run_refuses_hostile_plan_files(tmp_path, fn, target, message):
    path = tmp_path / "plan.json"
    path.write_text(_with_executable(_plan(), fn, target).to_json())
    result = subprocess.run([sys.executable, "-m", "pathways_mlir.cli.pw_run", str(path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"pw-run: error: {path}: plan: executable @") and message in lines[0], lines


T = "tensor<8x4xf32>"
TOKEN = '%t = stablehlo.create_token : !stablehlo.token\n'
# Modules JAX does not write, only a hand-made serialisation holds (`_with_body`): an MHLO custom call, which XLA
# compiles as StableHLO's (this one crashed pw-run, SIGSEGV), and ops that wait for the host (XLA:CPU blocks in
# infeed and outfeed forever: pw-run hung).
HOSTILE_BODIES = {
    "mhlo_callback": (f'%0 = "mhlo.custom_call"(%arg0) {{call_target_name = "xla_ffi_python_cpu_callback", '
                      f'api_version = 4 : i32, has_side_effect = true, backend_config = {{index = 1099511627776 : '
                      f'ui64}}}} : ({T}) -> {T}\nreturn %0 : {T}', "holds a 'mhlo.custom_call' op"),
    "infeed": (TOKEN + f'%0:2 = "stablehlo.infeed"(%t) {{infeed_config = "", layout = [[1, 0]]}} : '
                       f'(!stablehlo.token) -> ({T}, !stablehlo.token)\nreturn %0#0 : {T}',
               "holds a 'stablehlo.infeed' op, which waits for the host"),
    "outfeed": (TOKEN + f'%0 = "stablehlo.outfeed"(%arg0, %t) {{outfeed_config = ""}} : ({T}, !stablehlo.token) '
                        f'-> !stablehlo.token\nreturn %arg0 : {T}', "holds a 'stablehlo.outfeed' op"),
}


def _with_text(plan, edit):
    """`plan` with its one executable's module text replaced by `edit(text)`, serialised as `jax.export` would
    (the module's bytecode in its `Exported`)."""
    from jax.extend.mlir import ir
    from jax.interpreters import mlir

    (name,) = plan.executables
    exported = jax.export.deserialize(bytearray(base64.b64decode(plan.executables[name])))
    with mlir.make_ir_context():
        module = ir.Module.parse(edit(exported.mlir_module()))
        hostile = dataclasses.replace(exported, mlir_module_serialized=mlir.module_to_bytecode(module))
    return dataclasses.replace(plan, executables={name: base64.b64encode(hostile.serialize()).decode()})


def _with_body(plan, body: str):
    """`plan` with its one executable's `@main` body replaced by the MLIR text `body`."""
    def splice(text: str) -> str:
        start = text.index("{\n", text.index("func.func public @main")) + 2
        return text[:start] + body + text[text.index("\n  }", start):]
    return _with_text(plan, splice)


@pytest.mark.parametrize("kind", sorted(HOSTILE_BODIES))
def test_ops_of_other_dialects_and_host_waits_are_refused(kind):
    body, message = HOSTILE_BODIES[kind]
    with pytest.raises(PlanError) as error:
        pw.get_runtime().load(_with_body(_plan(), body))
    text = str(error.value)
    assert message in text and "executable @" in text and "\n" not in text, text


@pytest.mark.parametrize("kind", ["mhlo_callback", "infeed"])
def test_pw_run_refuses_them_in_one_line(tmp_path, kind):
    body, message = HOSTILE_BODIES[kind]
    path = tmp_path / "plan.json"
    path.write_text(_with_body(_plan(), body).to_json())
    result = subprocess.run([sys.executable, "-m", "pathways_mlir.cli.pw_run", str(path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


def test_an_arguments_mismatch_names_the_argument():
    plan = _plan()
    exported = jax.export.export(jax.jit(lambda x: x[:, :2]))(X)
    (name,) = plan.executables
    plan = dataclasses.replace(plan, executables={name: base64.b64encode(exported.serialize()).decode()})
    with pytest.raises(PlanError, match=r"result 0 is float32\[8, 2\], but the plan's buffer \d+ is "
                                        r"float32\[8, 4\]"):
        check_plan(plan)
    plan = dataclasses.replace(plan, executables={name: base64.b64encode(b"not an export").decode()})
    with pytest.raises(PlanError, match=r"is not a jax.export serialisation: its 13 bytes do not read as one \("):
        check_plan(plan)
    plan = dataclasses.replace(plan, executables={name: "!!!!"})     # (said only "...serialisation: Error")
    with pytest.raises(PlanError, match=r"executable @\w+ is not base64 text, as a plan's executables are$"):
        check_plan(plan)


F32, C64 = jnp.float32, jnp.complex64
LAPACK = {
    "cholesky": (jnp.linalg.cholesky, (3, 4, 4), F32),
    "qr": (jnp.linalg.qr, (3, 5, 4), F32),
    "qr_complete": (lambda a: jnp.linalg.qr(a, mode="complete"), (3, 5, 4), F32),
    "qr_wide": (jnp.linalg.qr, (2, 3, 6), F32),
    "eigh": (jnp.linalg.eigh, (3, 4, 4), F32),
    "eigh_complex": (jnp.linalg.eigh, (4, 4), C64),
    "eig": (jnp.linalg.eig, (3, 4, 4), F32),
    "eig_complex": (jnp.linalg.eig, (4, 4), C64),
    "svd": (jnp.linalg.svd, (3, 5, 4), F32),
    "svd_reduced": (lambda a: jnp.linalg.svd(a, full_matrices=False), (3, 5, 4), F32),
    "svd_values": (lambda a: jnp.linalg.svd(a, compute_uv=False), (3, 5, 4), F32),
    "svd_complex": (jnp.linalg.svd, (4, 4), C64),
    "lu": (lax.linalg.lu, (3, 5, 4), F32),
    "tridiagonal": (lax.linalg.tridiagonal, (3, 4, 4), F32),
    "tridiagonal_complex": (lax.linalg.tridiagonal, (4, 4), C64),
    "hessenberg": (lax.linalg.hessenberg, (3, 4, 4), F32),
    "schur": (lax.linalg.schur, (4, 4), F32),
    "schur_complex": (lax.linalg.schur, (4, 4), C64),
    "solve_left": (lambda a: lax.linalg.triangular_solve(a, a[..., :2], left_side=True), (3, 4, 4), F32),
    "solve_right": (lambda a: lax.linalg.triangular_solve(a, a[..., :2, :]), (3, 4, 4), F32),
    "tridiagonal_solve": (lambda a: lax.linalg.tridiagonal_solve(a[0], a[1], a[2], a), (4, 4), F32),
    "inv": (jnp.linalg.inv, (3, 4, 4), F32),
}


@pytest.mark.parametrize("name", sorted(LAPACK))
def test_jax_lapack_lowerings_pass(name):
    fn, shape, dtype = LAPACK[name]
    exported = jax.export.export(jax.jit(fn))(jax.ShapeDtypeStruct(shape, dtype))
    assert "lapack_" in exported.mlir_module()
    _check_module(name, exported, "plan")     # raises PlanError if refused


def test_approx_top_k_runs_as_under_jax_jit():
    """`jax.lax.approx_max_k` and `approx_min_k` lower to XLA's `ApproxTopK` custom call, which a plan may make."""
    def top(x):
        return lax.approx_max_k(x, 3), lax.approx_min_k(x, 2, reduction_dimension=0, aggregate_to_topk=False)

    x = np.random.default_rng(0).normal(size=(16, 64)).astype(np.float32)
    sharded = pw.jit(lambda x: lax.approx_max_k(x, 3), slice=pw.virtual_slice(4, axes="d", island="island0"),
                     in_specs=P("d"), out_specs=P("d"))
    for ours, theirs in ((pw.jit(top, slice=pw.virtual_slice(1, axes="d", island="island0"), in_specs=P(),
                                 out_specs=P())(x), jax.jit(top)(x)),
                         (sharded(x), jax.jit(lambda x: lax.approx_max_k(x, 3))(x))):
        for got, want in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_an_approx_top_k_call_declaring_other_results_fails_in_one_line(tmp_path):
    """XLA checks an `ApproxTopK` call's results against its operands and `top_k` when it compiles: a plan
    whose call says k=1 but declares four results a row fails its run with one line naming the call."""
    def say_k_is_1(text: str) -> str:
        assert "top_k = 4" in text
        return text.replace("top_k = 4", "top_k = 1")

    plan = _with_text(_plan(lambda x: lax.approx_max_k(x, 4)[0]), say_k_is_1)
    check_plan(plan)                      # its types agree with the plan's buffers: XLA is the one to refuse it
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    result = subprocess.run([sys.executable, "-m", "pathways_mlir.cli.pw_run", str(path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "ApproxTopK aggregates to k=1, but got 4" in lines[0], lines


def _without_frees(plan):
    """`plan` with its Free steps gone and its declared peaks kept: its buffers all live to the end."""
    islands = {name: tuple(s for s in steps if not s.frees()) for name, steps in plan.islands.items()}
    return dataclasses.replace(plan, islands=islands)


def test_a_peak_below_what_the_steps_hold_is_refused():
    """Admission reserves a plan's declared peak: a plan that declares less than its steps hold (a peak made
    smaller, or dropped, or its frees taken out) would let runs past the devices' memory. Each is one line
    naming the island and the device; a peak declared larger only reserves more."""
    one = pw.virtual_slice(1, axes="d", island="island0")
    grow = pw.jit(lambda x: jnp.tile(x, (4, 1)), slice=one, in_specs=P(), out_specs=P())
    shrink = pw.jit(lambda y: y[:8] * 2.0, slice=one, in_specs=P(), out_specs=P())

    @pw.program
    def chain(x):
        return shrink(grow(shrink(grow(x))))

    lowered = chain.lower(np.ones((8, 4), np.float32))
    plan = program_plans(lower(lowered.module, pw.get_runtime().resources.topology, fuse=False))[lowered.program]
    check_plan(plan)
    ((island, _),) = plan.peak_bytes.items()
    (begin, end, nbytes), = plan.peak(island)
    smaller = dataclasses.replace(plan, peak_bytes={island: (begin, end, nbytes - 1)})
    larger = dataclasses.replace(plan, peak_bytes={island: (begin, end, 2 * nbytes)})
    check_plan(larger)
    for hostile, needed in ((smaller, nbytes), (_without_frees(plan), 4 * 8 * 4 * (1 + 4 + 1 + 4 + 1))):
        with pytest.raises(PlanError) as error:
            pw.get_runtime().load(hostile)
        text = str(error.value)
        assert f"peak_bytes of '{island}' declare less than the {needed} bytes its steps hold on device {begin}" \
            in text and "\n" not in text, text
    with pytest.raises(PlanError, match=f"declares no peak_bytes for '{island}', whose steps hold {nbytes} bytes on "
                                        f"device {begin}: a plan's peaks come from pw-plan-memory"):
        pw.get_runtime().load(dataclasses.replace(plan, peak_bytes={}))


def _fused_plan():
    """The plan of a program of two functions on one slice, fused into one launch of one argument, with a
    JSON round trip (as `pw-run` reads a plan file)."""
    one = pw.virtual_slice(1, axes="d", island="island0")
    scale = pw.jit(lambda x: x * 3.0, slice=one, in_specs=P(), out_specs=P())
    shift = pw.jit(lambda y: y - 1.0, slice=one, in_specs=P(), out_specs=P())

    @pw.program
    def scaled_and_shifted(x):
        return shift(scale(x))

    lowered = scaled_and_shifted.lower(np.ones((8, 4), np.float32))
    plan = program_plans(lower(lowered.module, pw.get_runtime().resources.topology))[lowered.program]
    (name, fused), = plan.fused.items()
    assert fused.arguments == 1 and len(fused.calls) == 2
    return type(plan).from_json(plan.to_json())


def _with_launch_inputs(plan, inputs):
    """`plan` with its one launch given `inputs` (buffer ids) instead of its own."""
    (island, steps), = plan.islands.items()
    steps = tuple(dataclasses.replace(s, inputs=inputs(s.inputs)) if s.kind == "launch" else s for s in steps)
    return dataclasses.replace(plan, islands={island: steps})


@pytest.mark.parametrize("inputs, given", [(lambda ins: ins * 2, 2), (lambda ins: (), 0)], ids=["extra", "none"])
def test_a_fused_launch_of_another_number_of_inputs_is_refused(tmp_path, inputs, given):
    # A fused executable numbers its calls' results after its arguments: a launch that gave it one input more
    # ran, each call reading other values of the same avals than it was fused with (a wrong result, unnoticed).
    plan = _fused_plan()
    check_plan(plan)
    hostile = _with_launch_inputs(plan, inputs)
    (name,) = plan.fused
    message = f"executable @{name} has 1 arguments, but the plan gives {given}"
    with pytest.raises(PlanError) as error:
        pw.get_runtime().load(hostile)
    text = str(error.value)
    assert message in text and "step " in text and "\n" not in text, text
    path = tmp_path / "plan.json"
    path.write_text(hostile.to_json())
    result = subprocess.run([sys.executable, "-m", "pathways_mlir.cli.pw_run", str(path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"pw-run: error: {path}: plan: step ") and message in lines[0], lines
