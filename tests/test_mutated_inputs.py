"""Hostile files: the lit tests' IR and a lowered plan, mutated at random (fixed seeds), never crash the tools.

Each mutated input must be accepted or refused with an error (exit status 0 or
1), never a traceback or an internal error (status 2). The mutations are
the kinds that found bugs here: numbers, strings, symbols, types and tokens
replaced, lines deleted, duplicated or cut, attributes added; in a plan JSON,
values replaced, keys deleted and entries duplicated.
"""

import contextlib
import copy
import io
import json
import pathlib
import random
import re
import shlex

from pathways_mlir.cli import pw_opt, pw_sim

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOKENS = ["@a", "@b", "0", "-1", "8", "99999999999", '"x"', '""', "[]", "{}", "f32", "i1", "tensor<?xf32>",
          "array<i64>", "array<i65536: 4>", '[["x"], ["x"]]', "1.5", "true", "unit", '"dcn"']
TYPES = ["tensor<8xi1>", "tensor<f32>", "tensor<0x4xf32>", "tensor<*xf32>", "tensor<?x4xf32>", "i32",
         "tensor<4294967296xf32>", "memref<8xf32>"]
EXTRA_ATTRIBUTES = ["pw.placement = 3, ", 'pw.home = {slice = @zz, sharding = [["x"]]}, ', "pw.subgraph = -1, ",
                    "constraints = [], ", "devices = array<i64: 4, 0>, ", "shape = array<i24: 2>, "]


def _cases():
    """Each lit input's chunks (with some pw op) and the pass arguments of its RUN lines, plus pw-lower's."""
    cases = []
    for path in sorted((ROOT / "lit_tests" / "passes").glob("*.mlir")) + [ROOT / "lit_tests/dialect/ops.mlir"]:
        text = path.read_text()
        argsets = [["--pass-pipeline=builtin.module(pw-lower{topology=2x4})"]]
        for line in text.splitlines():
            if "RUN:" in line:
                command = line.split("RUN:", 1)[1].split("|")[0].strip().removeprefix("not ")
                argsets.append([a for a in shlex.split(command)[1:]
                                if a not in ("%s", "--split-input-file", "--verify-diagnostics")])
        cases.append(([c for c in text.split("// -----") if "pw." in c], argsets))
    return cases


def _replace_one(rng: random.Random, text: str, pattern: str, choices: list[str]) -> str:
    """`text` with one match of `pattern`, picked at random, replaced by one of `choices`."""
    found = list(re.finditer(pattern, text))
    if not found:
        return text
    m = rng.choice(found)
    return text[:m.start()] + rng.choice(choices) + text[m.end():]


def _mutate_ir(rng: random.Random, text: str) -> str:
    kind = rng.randrange(9)
    if kind == 0:
        return _replace_one(rng, text, r"-?\d+", ["0", "-1", "3", "65536", "99999999999"])
    elif kind == 1:
        return _replace_one(rng, text, r'"[^"\n]*"', ['"x"', '""', '"island9"', '"ici"'])
    elif kind == 2:
        lines = text.split("\n")
        del lines[rng.randrange(len(lines))]
        return "\n".join(lines)
    elif kind == 3:
        return _replace_one(rng, text, r"[@\w.<>\[\]\"]+", TOKENS)
    elif kind == 4:
        symbols = sorted(set(re.findall(r"@\w+", text)))
        if len(symbols) >= 2:
            a, b = rng.sample(symbols, 2)
            return text.replace(a, "@SWAP").replace(b, a).replace("@SWAP", b)
    elif kind == 5:
        lines = text.split("\n")
        i = rng.randrange(len(lines))
        return "\n".join(lines[:i + 1] + lines[i:])
    elif kind == 6:
        return _replace_one(rng, text, r"tensor<[^>]*>", TYPES)
    elif kind == 7:
        found = list(re.finditer(r"\{(sym_name|callee|label|src|dst|after|buffers|executable) = ", text))
        if found:
            at = rng.choice(found).start() + 1
            return text[:at] + rng.choice(EXTRA_ATTRIBUTES) + text[at:]
    else:
        return text[:rng.randrange(len(text))]
    return text


def _run(main, argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = main(argv)
    return status, err.getvalue()


def _crashed(status: int, stderr: str) -> bool:
    return status not in (0, 1) or "Traceback" in stderr or "internal error" in stderr or \
        (status == 1 and not stderr.strip())


def test_mutated_ir_is_accepted_or_refused_by_pw_opt(tmp_path):
    rng, cases, crashes = random.Random(17), _cases(), []
    path = tmp_path / "mutated.mlir"
    for _ in range(300):
        chunks, argsets = rng.choice(cases)
        text = rng.choice(chunks)
        for _ in range(rng.randint(1, 3)):
            text = _mutate_ir(rng, text)
        args = rng.choice(argsets)
        path.write_text(text)
        status, stderr = _run(pw_opt.main, [str(path), *args])
        if _crashed(status, stderr):
            crashes.append(f"{args}: status {status}: {stderr.strip()[-300:]}\n{text}")
    assert not crashes, f"{len(crashes)} of 300 crashed; the first:\n{crashes[0]}"


def _mutate_plan(rng: random.Random, plan: dict, paths: list) -> None:
    path = rng.choice(paths)
    parent = plan
    try:
        for key in path[:-1]:
            parent = parent[key]
        value = parent[path[-1]]
    except (KeyError, IndexError, TypeError):
        return
    key, r = path[-1], rng.random()
    if r < 0.15 and isinstance(parent, dict):
        del parent[key]
    elif r < 0.25 and isinstance(parent, list):
        parent.append(copy.deepcopy(value))
    elif isinstance(value, bool):
        parent[key] = not value
    elif isinstance(value, int):
        parent[key] = rng.choice([0, -1, 3, 7, 2 ** 31, 2 ** 63, 10 ** 30, 1.5, "3", None, []])
    elif isinstance(value, float):
        parent[key] = rng.choice([0.0, -1.0, 1e308, 1e-300, "x", None])
    elif isinstance(value, str):
        parent[key] = rng.choice(["", "x", "island9", "slice_b", "bf16", "launch", "copy", value + value, 3, None])
    elif isinstance(value, list):
        parent[key] = rng.choice([[], value[:1], value[::-1], value + value, {}, 0])
    elif isinstance(value, dict):
        parent[key] = rng.choice([{}, [], 0, "x"])


def _leaf_paths(node, prefix=()):
    yield prefix
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        if prefix or key != "executables":
            yield from _leaf_paths(value, prefix + (key,))


def test_mutated_plan_json_is_refused_or_simulated_by_pw_sim(tmp_path):
    lowered = tmp_path / "plan.json"
    status, stderr = _run(pw_opt.main, [str(ROOT / "examples/three_blocks.mlir"), "-o", str(lowered),
                                        "--pass-pipeline=builtin.module(pw-lower{topology=2x4})",
                                        "--emit=plan-json"])
    assert status == 0, stderr
    base = json.loads(lowered.read_text())
    paths = list(_leaf_paths(base))[1:]
    rng, crashes, path = random.Random(2), [], tmp_path / "mutated.json"
    for _ in range(300):
        plan = copy.deepcopy(base)
        for _ in range(rng.randint(1, 2)):
            _mutate_plan(rng, plan, paths)
        path.write_text(json.dumps(plan))
        status, stderr = _run(pw_sim.main, ["run", str(path), "--profile", "cpu-here"])
        if _crashed(status, stderr):
            crashes.append(f"status {status}: {stderr.strip()[-300:]}")
    assert not crashes, f"{len(crashes)} of 300 crashed; the first: {crashes[0]}"


def test_mutated_plans_of_a_jax_program_load_and_run_or_are_refused_in_one_line():
    """The three-block example lowered from JAX with island fusion (its executables real exports), its plan
    mutated and loaded on an embedded runtime: each mutation is refused at load in one line (`PlanError`, or
    another `ValueError` or `TypeError`), or it runs and every result reads back, or fails in one line, within
    a bound; the runtime runs the plan as lowered afterwards. Mutating the plan sent to `pw-serve` found three
    kinds that loaded and failed only at the run (a fused call constraining an operand to an axis twice or to
    another rank, one calling an executable the plan lacks) and one whose second result hung (`return y, y`)."""
    import importlib.util

    import jax
    import numpy as np

    from pathways_mlir.dialect.plan import ProgramPlan
    from pathways_mlir.passes import lower_to_plans
    from pathways_mlir.runtime.client import Client
    from pathways_mlir.runtime.cluster import embedded_device_map
    from pathways_mlir.runtime.island_work import RunFailed
    from pathways_mlir.runtime.runtime import Runtime

    spec = importlib.util.spec_from_file_location("three_blocks_example", ROOT / "examples" / "three_blocks.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    x = np.random.default_rng(0).normal(size=(8, 16)).astype(np.float32)
    runtime = Runtime(embedded_device_map(2, 4))
    try:
        lowered = example.three_blocks.lower(jax.ShapeDtypeStruct(x.shape, x.dtype))
        plan = lower_to_plans(lowered.module, runtime.resources.topology, fuse=True)[lowered.program]
        base = plan.to_python()
        paths = [p for p in _leaf_paths(base) if p and p[0] != "executables"]
        rng, problems, ran = random.Random(5), [], 0
        with Client(runtime) as client:
            expected = np.asarray(client.run(plan, [x])[0])
            for i in range(150):
                value = copy.deepcopy(base)
                for _ in range(rng.randint(1, 2)):
                    _mutate_plan(rng, value, paths)
                try:
                    mutated = ProgramPlan.from_python(value)
                    runtime.load(mutated)
                except (ValueError, TypeError) as error:
                    if "\n" in str(error) or not str(error):
                        problems.append(f"mutation {i}: refused in more than one line: {error!r}"[:400])
                    continue
                ran += 1
                try:
                    handles = client.run(mutated, [x] * len(mutated.inputs))
                    for handle in handles:
                        np.asarray(handle.result(timeout=60))
                except (RunFailed, ValueError, TypeError) as error:
                    if "\n" in str(error):
                        problems.append(f"mutation {i}: failed in more than one line: {error!r}"[:400])
                except Exception as error:  # noqa: BLE001  (anything else is what this test looks for)
                    problems.append(f"mutation {i} loaded, then its run raised {error!r}"[:400])
            np.testing.assert_allclose(np.asarray(client.run(plan, [x])[0]), expected)
        assert not problems, "\n".join(problems)
        assert ran > 5          # mutations that load (values swapped for others that fit) are run, not only refused
    finally:
        runtime.close()
