"""Importing pathways_mlir has no side effect that can fail; host devices are prepared for JAX's first use."""

import os
import subprocess
import sys


def python(code: str, **env):
    environ = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PW_CLUSTER")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**environ, **env})


def test_a_bad_cluster_does_not_break_the_import_or_pw_opt(tmp_path):
    result = python("import os, sys, pathways_mlir\n"
                    "from pathways_mlir.cli import pw_opt\n"
                    "status = pw_opt.main(['--list-passes'])\n"
                    "print(status, 'jax' in sys.modules, os.environ.get('XLA_FLAGS'))", PW_CLUSTER="bad")
    assert result.returncode == 0, result.stderr
    # pw-opt never starts JAX, so nothing read PW_CLUSTER or set XLA_FLAGS.
    assert result.stdout.strip().endswith("0 False None")


def test_a_bad_cluster_is_an_error_where_the_cluster_is_made():
    result = python("import pathways_mlir as pw\n"
                    "try:\n    pw.get_runtime()\nexcept pw.runtime.cluster.ClusterError as e:\n    print('error:', e)",
                    PW_CLUSTER="bad")
    assert result.returncode == 0, result.stderr
    assert "error: PW_CLUSTER='bad': expected ISLANDSxDEVICES, e.g. 2x4" in result.stdout


def test_jax_used_after_the_import_sees_the_cluster_devices():
    # Imported first, then JAX used directly (as the README does).
    after = python("import pathways_mlir, jax; print(len(jax.devices()))", PW_CLUSTER="3x2")
    # JAX imported first but not yet started: still in time.
    before = python("import jax, pathways_mlir; print(len(jax.devices()))", PW_CLUSTER="3x2")
    assert (after.stdout.strip(), before.stdout.strip()) == ("6", "6"), after.stderr + before.stderr


def test_configure_before_jax_is_used_asks_for_its_clusters_devices():
    """`pw.configure(islands=, per_island=)` before JAX's first use (as examples/rl_loop.py does) asked XLA for
    no devices: the first call failed with a ClusterError advising to do just that. A larger count is asked
    for (before or after JAX's import); the user's own XLA_FLAGS count is kept, and a cluster larger than it is
    the same one-line error as before."""
    code = ("import pathways_mlir as pw, numpy as np\n{first}"
            "pw.configure(islands=4, per_island=4)\n"
            "f = pw.jit(lambda x: x + 1, slice=pw.virtual_slice(1, axes='x', island='island3'))\n"
            "print(np.asarray(f(np.ones(2, np.float32))).tolist(), len(__import__('jax').devices()))")
    for first in ("", "import jax\n"):
        result = python(code.format(first=first), PW_CLUSTER="1x2")
        assert (result.returncode, result.stdout.strip()) == (0, "[2.0, 2.0] 16"), result.stderr
    mine = python(code.format(first=""), XLA_FLAGS="--xla_force_host_platform_device_count=8")
    assert mine.returncode == 1 and mine.stderr.strip().splitlines()[-1].endswith(
        "ClusterError: the embedded cluster needs 16 CPU devices but JAX has 8: import pathways_mlir (or call "
        "pathways_mlir.configure) before JAX is first used, or set XLA_FLAGS=--xla_force_host_platform_device_count=16"
    ), mine.stderr


_ORBAX_SAVE = """
import os, sys, tempfile, numpy as np
{first}
import jax.numpy as jnp
s = pw.virtual_slice(2, axes="d")
h = pw.jit(lambda x: x * 2, slice=s)(jnp.arange(4.0))
{then}
path = os.path.join(tempfile.mkdtemp(), "state")
ocp.PyTreeCheckpointer().save(path, {{"h": h, "rows": [h, h + 1]}})
restored = ocp.PyTreeCheckpointer().restore(path)
print(np.asarray(restored["h"]).tolist(), np.asarray(restored["rows"][1]).tolist(), type(restored["h"]).__name__,
      sum(type(f).__name__ == "_AfterImport" for f in sys.meta_path))
"""


def test_orbax_pytree_checkpointing_takes_handles_whichever_is_imported_first():
    """Orbax's PyTree checkpointing had no type handler for a handle ("TypeHandler lookup failed"); the handle
    types are registered with its `jax.Array` handler when `orbax.checkpoint` is imported, before or after
    pathways_mlir (then by an import hook, which goes once it has run, not at a lookup that imports nothing)."""
    # (a library checking for an optional dependency looks Orbax up without importing it: the hook stays)
    for first, then in (("import pathways_mlir as pw", "import orbax.checkpoint as ocp"),
                        ("import pathways_mlir as pw", "import importlib.util\n"
                         "assert importlib.util.find_spec('orbax.checkpoint')\nimport orbax.checkpoint as ocp"),
                        ("import orbax.checkpoint as ocp\nimport pathways_mlir as pw", "")):
        result = python(_ORBAX_SAVE.format(first=first, then=then), PW_CLUSTER="1x2")
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.split("\n")[-2] == "[0.0, 2.0, 4.0, 6.0] [1.0, 3.0, 5.0, 7.0] ArrayImpl 0", result.stdout


def test_the_errors_the_readme_names_are_the_packages_own_names():
    """`ServiceError`, `PlanError`, `RunFailed` and `TopologyChanged` were named by the README as the package's
    exceptions but could be caught only from their submodules; each is now `pw.<name>`, as the others are."""
    import pathways_mlir as pw
    from pathways_mlir.dialect.plan_json import PlanError
    from pathways_mlir.runtime.island_work import RunFailed
    from pathways_mlir.runtime.remote_client import ServiceError
    from pathways_mlir.runtime.resource_manager import TopologyChanged

    assert (pw.PlanError, pw.RunFailed, pw.ServiceError, pw.TopologyChanged) == \
        (PlanError, RunFailed, ServiceError, TopologyChanged)
    assert all(isinstance(getattr(pw, name), type) or callable(getattr(pw, name)) for name in pw.__all__)
