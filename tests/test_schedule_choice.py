"""`pw.pipeline(..., schedule="auto")`: every offered schedule simulated, the fastest that fits picked and run."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fetching import fetch

import pathways_mlir as pw
from pathways_mlir.passes import lower_to_plans
from pathways_mlir.sim import schedules
from pathways_mlir.sim.profile import ProfileError, profile_of_kind

STAGES, WIDTH, ROWS = 4, 32, 256


def stage(params, x):
    return jnp.tanh(x @ params["w"] + params["b"])


def mse(y, target):
    return jnp.mean((y - target) ** 2)


def example():
    rng = np.random.default_rng(0)
    params = [{"w": rng.normal(0, WIDTH ** -0.5, (WIDTH, WIDTH)).astype(np.float32),
               "b": rng.normal(0, 0.1, WIDTH).astype(np.float32)} for _ in range(STAGES)]
    return params, rng.normal(size=(ROWS, WIDTH)).astype(np.float32), rng.normal(size=(ROWS, WIDTH)).astype(np.float32)


def slices():
    return [pw.virtual_slice(2, axes="x", island=f"island{s}") for s in range(STAGES)]


def auto(micro_batches=8, **options):
    return pw.pipeline([stage] * STAGES, slices(), loss=mse, schedule="auto", micro_batches=micro_batches, **options)


def test_auto_picks_the_fastest_simulated_schedule_and_runs_it(four_islands):
    runtime = four_islands.runtime
    params, x, target = example()
    step = auto()
    compiled = step.compiled(params, x, target, runtime=runtime)
    choice = step.choice
    assert set(choice.reports) == {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1"} and not choice.not_offered
    # Each named schedule's own step, lowered for this runtime and simulated apart, gives the choice's figures.
    _, topology = runtime.resources.snapshot()
    profile = profile_of_kind("cpu")
    alone = {}
    for name in choice.reports:
        lowered = pw.pipeline([stage] * STAGES, slices(), loss=mse, schedule=name, micro_batches=8).lower(params, x, target)
        alone[name] = schedules.report(lower_to_plans(lowered.module, topology)[lowered.program], profile)
        assert alone[name]["step_ms"] == pytest.approx(choice.reports[name]["step_ms"], rel=1e-9)
        assert alone[name]["peak_bytes"] == choice.reports[name]["peak_bytes"]
    assert choice.pick == min(alone, key=lambda name: alone[name]["step_ms"])
    assert compiled.plan.program == f"pipeline_{choice.pick}" and choice.profile == "cpu-here"
    assert compiled.memory_analysis().peak_bytes == choice.reports[choice.pick]["peak_bytes"]
    # The pick runs, and its loss and gradients are the unpipelined step's.
    loss, grads = fetch(step(params, x, target, client=four_islands))

    def unpipelined(params):
        y = x
        for p in params:
            y = stage(p, y)
        return mse(y, target)
    expected_loss, expected_grads = jax.jit(jax.value_and_grad(unpipelined))(params)
    assert step.eval_shape(params, x, target) == jax.eval_shape(jax.value_and_grad(unpipelined), params)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    for ours, theirs in zip(jax.tree.leaves(grads), jax.tree.leaves(expected_grads)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-7)
    text = choice.summary()
    assert f"picked: {choice.pick}" in text and all(name in text for name in choice.reports)


def test_a_schedule_that_does_not_fit_is_not_picked(four_islands):
    runtime = four_islands.runtime
    params, x, target = example()
    roomy = auto().choose(params, x, target, runtime=runtime)
    peak = {name: max(r["peak_bytes"].values()) for name, r in roomy.reports.items()}
    assert peak["gpipe"] > max(peak["1f1b"], peak["zb-h1"])       # GPipe keeps all 8 micro-batches' residuals
    tight = auto(memory_bytes=peak["gpipe"] - 1).choose(params, x, target, runtime=runtime)
    assert not tight.reports["gpipe"]["fits"]
    fitting = [name for name, r in tight.reports.items() if r["fits"]]
    assert fitting and tight.pick == min(fitting, key=lambda name: tight.reports[name]["step_ms"])
    assert "does not fit" in tight.summary()
    with pytest.raises(ValueError, match=r"^no pipeline schedule fits the device memory \(1000 bytes per device\)"):
        auto(memory_bytes=1000).choose(params, x, target, runtime=runtime)
    assert schedules.pick({"a": {"fits": False, "step_ms": 1.0}, "b": {"fits": True, "step_ms": 2.0}}) == "b"


def test_a_schedule_the_slices_rule_out_is_not_offered(four_islands):
    params, x, target = example()
    step = auto(micro_batches=2)         # interleaved-1f1b on 4 slices needs a multiple of 4 micro-batches
    choice = step.choose(params, x, target, runtime=four_islands.runtime)
    assert "interleaved-1f1b" not in choice.reports
    assert "multiples of the slices (4)" in choice.not_offered["interleaved-1f1b"]
    assert re.search(r"interleaved-1f1b +not offered: .*multiples of the slices \(4\)", choice.summary())


def test_auto_draws_the_schedule_it_picked(four_islands, tmp_path):
    params, x, target = example()
    step = auto(micro_batches=4)
    with pytest.raises(ValueError, match=r"^a pipeline with schedule='auto' has no schedule to draw before it picks "
                                         r"one: call the step \(or step.choose\(\*args\)\) first$"):
        step.draw(str(tmp_path / "auto.png"))
    choice = step.choose(params, x, target, runtime=four_islands.runtime)
    assert step.draw(str(tmp_path / "auto.png")) == choice.program.draw(str(tmp_path / "pick.png"))
    assert (tmp_path / "auto.png").read_bytes() == (tmp_path / "pick.png").read_bytes()


def test_bad_auto_options_are_one_line_errors():
    for bad in (0, -5, 1.5, True):
        with pytest.raises(ValueError, match=r"^memory_bytes must be a positive number of bytes per device"):
            auto(memory_bytes=bad)
    with pytest.raises(TypeError, match=r"^profile must be a profile name, a JSON path or a sim Profile, not int"):
        auto(profile=3)
    with pytest.raises(ProfileError, match=r"^no profile named 'nope'"):
        auto(profile="nope")
    with pytest.raises(ValueError, match=r"^profile and memory_bytes are for schedule='auto'"):
        pw.pipeline([stage] * STAGES, slices(), loss=mse, schedule="1f1b", micro_batches=8, memory_bytes=1 << 20)
    with pytest.raises(ValueError, match="one slice per stage: 4 stages, 1 slices"):
        pw.pipeline([stage] * STAGES, slices()[:1], loss=mse, schedule="auto", micro_batches=8)
    with pytest.raises(ProfileError, match=r"^no bundled profile describes device kind 'abacus'"):
        profile_of_kind("abacus")
    step = auto()

    @pw.program
    def outer(params, x, target):
        return step(params, x, target)
    with pytest.raises(ValueError, match=r"^a pipeline with schedule='auto' picks its schedule for a runtime"):
        outer.lower(*example())
