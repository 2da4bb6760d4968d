"""`pw-bench`: the Pathways paper's experiments as side-by-side benchmarks.

Each benchmark module has `NAME`, `HEADLINE` (the names of its headline
ratios), `run(quick: bool) -> dict`, returning a record made by
`harness.record`, and `plot(record, ax)`, drawing its figure of the paper on
a matplotlib axes. Optional: `LOWER_IS_BETTER`, the headlines that read the
other way (a time, bytes or an error of ours; the report marks them), and
`FIGURES`, the file names of the figures that its `run(quick, plots=FOLDER)`
draws into FOLDER (`pw-bench` passes plots/ beside the record). Our system
and its baselines run in the same process, interleaved, several times; the
results are medians and ratios. `report` turns records into `RESULTS.md`
and plots.
"""

import importlib
from types import ModuleType

# Benchmark names (part of `pw-bench`'s interface) and their modules, in report order.
BENCHMARKS = {
    "dispatch": "dispatch",
    "crossover": "crossover",
    "first-call": "first_call",
    "parallel-dispatch": "parallel_dispatch",
    "multi-tenancy": "multi_tenancy",
    "mixed-serving": "mixed_serving",
    "pipeline": "pipeline",
    "three-blocks": "three_blocks",
    "pipeline-schedules": "pipeline_schedules",
    "lowering-scale": "lowering_scale",
    "object-store": "object_store",
    "rl": "rl",
    "moe": "moe",
    "ray": "ray_backend",
    "service": "service",
    "placement": "placement",
    "sim": "sim",
    "elastic": "elastic",
    "elastic-shrink": "elastic_shrink",
    "shared-base": "shared_base",
}


def load(name: str) -> ModuleType:
    """Returns the module of benchmark `name` (it imports JAX, so only when needed)."""
    return importlib.import_module(f"{__name__}.{BENCHMARKS[name]}")
