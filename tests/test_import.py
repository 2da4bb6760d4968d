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
