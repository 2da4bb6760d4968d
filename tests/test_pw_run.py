"""pw-run: scripts, pw IR and plans on the embedded cluster; one-line errors."""

import concurrent.futures
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def pw_run(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "pathways_mlir.cli.pw_run", *map(str, args)],
                          capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


def pw_run_each(argument_lists: list[tuple]) -> list[subprocess.CompletedProcess]:
    """Runs pw-run once per argument list, four at a time, and returns their results in order (each process
    spends most of its time importing JAX, on one core)."""
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda args: pw_run(*args), argument_lists))


def test_runs_the_example_script_and_matches_jax():
    # As a shell starts it: JAX, imported here, sets TF_CPP_MIN_LOG_LEVEL, which would hide XLA's own logging.
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    result = pw_run(ROOT / "examples" / "three_blocks.py", env=env)
    assert result.returncode == 0, result.stderr
    assert "matches plain JAX: True" in result.stdout
    assert result.stderr == ""                    # none of XLA's own INFO lines when its CPU devices start


def test_runs_pw_ir_and_plans_with_a_trace(tmp_path):
    from pathways_mlir.passes import lower, program_plans
    from pathways_mlir.runtime.cluster import embedded_device_map

    ir_file = ROOT / "examples" / "three_blocks.mlir"
    trace = tmp_path / "trace.json"
    result = pw_run(ir_file, "--repeat", "2", "--trace", trace, "--dispatch", "sequential")
    assert result.returncode == 0, result.stderr
    # strategy=auto keeps the three small blocks on island0: DCN would cost more than sharing devices.
    assert "program @three_blocks on island0 (sequential dispatch)" in result.stdout
    assert "result 0: float32[8, 16] on slice_c" in result.stdout
    events = json.loads(trace.read_text())["traceEvents"]
    # pw-fuse-island ran the three blocks as one launch: its label lists them.
    assert "block_a#0+block_b#0+block_c#0" in {e["name"] for e in events if e["ph"] == "X"}

    topology = embedded_device_map(2, 4).topology
    plan = program_plans(lower(ir_file.read_text(), topology))["three_blocks"]
    (tmp_path / "plan.json").write_text(plan.to_json())
    from_plan = pw_run(tmp_path / "plan.json")
    assert from_plan.returncode == 0, from_plan.stderr
    # The same seeded inputs give the same result line from IR and from the plan.
    line = [ln for ln in result.stdout.splitlines() if "result 0" in ln]
    assert line == [ln for ln in from_plan.stdout.splitlines() if "result 0" in ln]


def test_bad_inputs_fail_in_one_line(tmp_path):
    (tmp_path / "bad.mlir").write_text('"pw.compute"() : () -> ()\n')
    (tmp_path / "bad.json").write_text('{"program": 1}')
    (tmp_path / "boom.py").write_text("x = 1\nraise ValueError('boom')\n")
    (tmp_path / "deep.mlir").write_text("module {" * 5000 + "}" * 5000)
    # A lowered module whose plan reads a buffer nothing writes (it would hang the runtime).
    valid_plan = (ROOT / "lit_tests" / "passes" / "verify-plans.mlir").read_text().split("// -----")[0]
    (tmp_path / "hostile.mlir").write_text(valid_plan.replace("@main, inputs = array<i64: 0>", "@main, inputs = array<i64>"))
    cases = {
        tmp_path / "deep.mlir": "deep.mlir:1:2056: error: '{' nests deeper than 256 levels",
        tmp_path / "hostile.mlir": "error: 'pw.launch' op plan of @main: step 0 (launch) reads buffer 0, which nothing "
                                   "writes",
        tmp_path / "missing.mlir": "no such file",
        tmp_path / "bad.mlir": "bad.mlir:1:1: error: 'pw.compute' op attribute 'callee' is expected",
        tmp_path / "bad.json": "not a pw plan",
        tmp_path / "boom.py": "boom.py:2: ValueError: boom",
        tmp_path / "empty.py": "empty.py: the script is empty: nothing to run",
        tmp_path / "empty.mlir": "empty.mlir: no program to run: the file holds no pw.program",
        tmp_path / "nested.json": "nested.json: invalid JSON: nested too deeply",
        tmp_path / "dir": "dir: is a directory: give a .py script, a .mlir file or a .json plan",
    }
    (tmp_path / "empty.py").write_text("")
    (tmp_path / "empty.mlir").write_text("")
    (tmp_path / "nested.json").write_text("[" * 100000 + "]" * 100000)
    (tmp_path / "dir").mkdir()
    # A plan placed for 2 islands of 4 on a cluster of one island; a negative --repeat.
    from pathways_mlir.dialect.topology import Topology
    from pathways_mlir.passes import lower, program_plans

    plan = program_plans(lower((ROOT / "examples" / "three_blocks.mlir").read_text(), Topology.uniform(2, 4),
                               strategy="spread"))["three_blocks"]
    (tmp_path / "plan.json").write_text(plan.to_json())
    plan_cases = [((tmp_path / "plan.json", "--cluster", "1x4"),
                   "@three_blocks is placed for island0: 4 devices, island1: 4 devices, but the cluster "
                   "has island0: 4 devices (--cluster ISLANDSxDEVICES chooses it)"),
                  ((tmp_path / "plan.json", "--repeat", "-3"),
                   "pw-run: error: Invalid value for '--repeat': -3 is not in the range x>=0."),
                  ((tmp_path / "plan.json", "--seed", "-5"),
                   "pw-run: error: Invalid value for '--seed': -5 is not in the range x>=0."),
                  ((tmp_path / "plan.json", "--trace", str(tmp_path / "missing" / "t.json")),
                   f"pw-run: error: cannot write {tmp_path / 'missing' / 't.json'}: its folder does not exist"),
                  # The option as written, not the PW_CLUSTER it sets (which named a variable never set).
                  ((tmp_path / "plan.json", "--cluster", "99999x99999"),
                   "pw-run: error: --cluster 99999x99999: 9999800001 CPU devices; an embedded cluster has "
                   "at most 4096"),
                  ((tmp_path / "plan.json", "--cluster", "2x"),
                   "pw-run: error: --cluster 2x: expected ISLANDSxDEVICES, e.g. 2x4")]
    results = pw_run_each([(path,) for path in cases] + [args for args, _ in plan_cases])
    for (path, message), result in zip(cases.items(), results):
        assert result.returncode == 1, (path, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert path.name in ("bad.mlir", "hostile.mlir") or len(result.stderr.strip().splitlines()) == 1, \
            result.stderr          # IR gets one line per diagnostic
    for (args, message), result in zip(plan_cases, results[len(cases):]):
        assert result.returncode == 1 and message in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_script_is_refused_the_options_of_ir_and_plan_files_instead_of_ignoring_them():
    script = ROOT / "examples" / "three_blocks.py"
    options = (["--dispatch", "sequential"], ["--repeat", "3"], ["--seed", "1"], ["--program", "three_blocks"])
    for option, result in zip(options, pw_run_each([(script, *option) for option in options])):
        assert result.returncode == 1, (option, result.stdout)
        assert result.stderr.strip() == (f"pw-run: error: {script}: {option[0]} applies to IR and plan files, not "
                                         f"to a script, which chooses its own programs, dispatch "
                                         f"(f.run(..., dispatch=...)) and inputs")


def test_help_says_the_cluster_may_be_ray_actors():
    result = pw_run("--help")
    assert result.returncode == 0 and "on the embedded cluster" not in result.stdout
    assert "each island in a Ray actor with --backend ray" in " ".join(result.stdout.split())


def test_pw_opt_writes_the_plan_json_that_pw_run_reads(tmp_path):
    plan = tmp_path / "plan.json"
    lowered = subprocess.run([sys.executable, "-m", "pathways_mlir.cli.pw_opt", str(ROOT / "examples" /
                              "three_blocks.mlir"), "--pw-lower=topology=2x4", "--emit=plan-json", "-o", str(plan)],
                             capture_output=True, text=True, timeout=300)
    assert lowered.returncode == 0, lowered.stderr
    result = pw_run(plan)
    assert result.returncode == 0, result.stderr
    assert "program @three_blocks on island0" in result.stdout
    unlowered = subprocess.run([sys.executable, "-m", "pathways_mlir.cli.pw_opt", str(ROOT / "examples" /
                                "three_blocks.mlir"), "--emit=plan-json"], capture_output=True, text=True, timeout=300)
    assert unlowered.returncode == 1 and unlowered.stderr.strip().endswith(
        "error: --emit=plan-json needs a module with plans: add --pw-lower (for example --pw-lower=topology=2x4)")


def test_runs_the_example_on_the_ray_backend():
    import pytest

    pytest.importorskip("ray")
    result = pw_run(ROOT / "examples" / "three_blocks.py", "--backend", "ray")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "matches plain JAX: True" in result.stdout
    assert "Traceback" not in result.stderr


def test_a_script_that_configures_its_cluster_keeps_the_backend_of_the_command_line(tmp_path):
    """`pw-run SCRIPT --backend ray` ran on the embedded backend, saying nothing, when the script set its
    cluster's shape with `pw.configure` (as examples/rl_loop.py does): its options replaced the command's."""
    import pytest

    pytest.importorskip("ray")
    (tmp_path / "shaped.py").write_text(
        "import numpy as np\nimport pathways_mlir as pw\n"
        "pw.configure(islands=2, per_island=2)\n"
        "f = pw.jit(lambda x: x + 1, slice=pw.virtual_slice(2, axes='x', island='island1'))\n"
        "print(np.asarray(f(np.ones(2, np.float32))).tolist(), type(pw.get_runtime().islands).__name__,\n"
        "      len(pw.get_runtime().islands))\n")
    result = pw_run(tmp_path / "shaped.py", "--backend", "ray")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[2.0, 2.0] RayIslands 2", result.stdout


def test_a_script_configuring_a_larger_cluster_runs_and_is_traced(tmp_path):
    """pw-run made the default runtime before it ran the script: JAX started with PW_CLUSTER's devices, so a
    script whose pw.configure asks for more failed with a ClusterError (`python script.py` ran it), and its
    trace, started on the runtime the script replaced, was empty (found by a review). The runtime is now made at
    its first use, with the trace."""
    (tmp_path / "larger.py").write_text(
        "import numpy as np\nimport pathways_mlir as pw\n"
        "pw.configure(islands=3, per_island=2)\n"
        "def plus(x):\n    return x + 1\n"
        "f = pw.jit(plus, slice=pw.virtual_slice(2, axes='x', island='island2'))\n"
        "print(np.asarray(f(np.ones(2, np.float32))).tolist())\n")
    trace = tmp_path / "t.json"
    result = pw_run(tmp_path / "larger.py", "--trace", trace, env={**os.environ, "PW_CLUSTER": "1x1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[0] == "[2.0, 2.0]"
    events = json.loads(trace.read_text())["traceEvents"]
    assert [e["name"] for e in events if e["ph"] == "X"] == ["plus#0", "plus#0"], events     # one per device


def test_pw_runs_options_do_not_outlive_it_in_its_process(tmp_path):
    """`pw_run.main` called in a process (as a test does) left its options to every later pw.configure there:
    pw.configure(islands=2, per_island=2) after it still got emulate_dcn=True (found by a review)."""
    import pathways_mlir as pw
    from pathways_mlir.cli import pw_run as command
    from pathways_mlir.runtime import runtime

    (tmp_path / "nothing.py").write_text("pass\n")
    try:
        assert command.main([str(tmp_path / "nothing.py"), "--emulate-dcn"]) == 0
        pw.configure(islands=2, per_island=2)
        assert runtime._default_options == {"islands": 2, "per_island": 2}
    finally:
        pw.configure()


def test_a_complex_result_sums_both_its_parts_without_a_warning(tmp_path):
    # The sum was cast to float64: the imaginary part dropped, and NumPy's ComplexWarning on stderr.
    import numpy as np

    (tmp_path / "progs.py").write_text(
        "from jax.sharding import PartitionSpec as P\nimport pathways_mlir as pw\n"
        "a = pw.virtual_slice(2, axes='data', name='a')\n\n"
        "@pw.jit(slice=a, in_specs=P('data'), out_specs=P('data'))\ndef scale(x):\n    return x * (1 + 2j)\n\n"
        "@pw.program\ndef pc(x):\n    return scale(x)\n")
    exported = subprocess.run([sys.executable, "-m", "pathways_mlir.cli.pw_export", "progs.py:pc", "--arg",
                               "complex64[4,2]", "-o", "pc.mlir"], capture_output=True, text=True, timeout=300,
                              cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    result = pw_run("pc.mlir", "--seed", "1", cwd=tmp_path)
    assert result.returncode == 0 and "Warning" not in result.stderr, result.stderr
    x = np.random.default_rng(1).integers(-8, 8, size=(4, 2)).astype(np.complex64)
    assert f"sum={(x * (1 + 2j)).sum():.6g} " in result.stdout, result.stdout


def test_a_script_that_never_ends_is_refused_at_its_first_read(tmp_path):
    # A script linked to /dev/zero was read whole to see whether it was empty: memory filled (a MemoryError under
    # the address-space limit set here).
    import resource

    (tmp_path / "z.py").symlink_to("/dev/zero")
    limit = lambda: resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))   # noqa: E731
    result = subprocess.run([sys.executable, "-m", "pathways_mlir.cli.pw_run", "z.py"], capture_output=True,
                            text=True, timeout=300, cwd=tmp_path, preexec_fn=limit)
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip() == "pw-run: error: z.py: the script contains a NUL byte, which Python source cannot"


def test_emulated_dcn_takes_the_clusters_link_not_the_figures_the_plan_declares(tmp_path):
    # A plan whose topology declared a DCN latency of 1e12 us made `pw-run --emulate-dcn` sleep for 11 days.
    from pathways_mlir.dialect.topology import Topology
    from pathways_mlir.passes import lower, program_plans

    plan = program_plans(lower((ROOT / "examples" / "three_blocks.mlir").read_text(), Topology.uniform(2, 4),
                               strategy="spread"))["three_blocks"]
    assert any(s.kind == "send" for steps in plan.islands.values() for s in steps)
    value = plan.to_python()
    value["topology"]["dcn"]["latency_us"] = 1e12
    (tmp_path / "plan.json").write_text(json.dumps(value))
    result = pw_run(tmp_path / "plan.json", "--emulate-dcn")     # (bounded: pw_run's timeout)
    assert result.returncode == 0, result.stderr
    assert "result 0: float32[8, 16]" in result.stdout


IDENTITY = """module {
  func.func @ident(%arg0: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {pw.program} {
    return %arg0 : tensor<8x16xf32>
  }
}
"""


def test_a_program_with_no_island_step_is_said_to_run_on_the_host(tmp_path):
    # A program that returns its argument has no step on any island: pw-run printed "program @ident on  (parallel
    # dispatch)" and "result 0: ... on None".
    (tmp_path / "ident.mlir").write_text(IDENTITY)
    result = pw_run(tmp_path / "ident.mlir")
    assert result.returncode == 0, result.stderr
    assert "program @ident on the host alone (parallel dispatch)" in result.stdout, result.stdout
    assert "result 0: float32[8, 16] on the host sum=" in result.stdout, result.stdout


def test_a_trace_path_that_is_empty_or_the_file_to_run_is_refused(tmp_path):
    # `--trace ""` ran without a trace, saying nothing; `--trace` naming the file to run replaced it with the trace.
    # So did a hard link to it (found by a review).
    (tmp_path / "ident.mlir").write_text(IDENTITY)
    os.link(tmp_path / "ident.mlir", tmp_path / "linked.mlir")
    same = [(path, f"pw-run: error: --trace {path} is {tmp_path / 'ident.mlir'}, the file to run: the trace would "
                   f"replace it") for path in (tmp_path / "ident.mlir", tmp_path / "linked.mlir")]
    for trace, message in [("", "pw-run: error: Invalid value for '--trace': an empty path names no file "
                                "(--help for usage)"), *same]:
        result = pw_run(tmp_path / "ident.mlir", "--trace", trace)
        assert result.returncode == 1 and result.stderr.strip() == message, result.stderr
        assert result.stdout == "", result.stdout
    assert (tmp_path / "ident.mlir").read_text() == IDENTITY
