"""The bundled examples (`examples/*.py`, in a source checkout), imported as modules."""

from __future__ import annotations

import importlib.util
import pathlib
from types import ModuleType

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str) -> ModuleType:
    """Imports `examples/NAME.py` without running its `__main__` part."""
    path = EXAMPLES / f"{name}.py"
    if not path.exists():
        raise RuntimeError(f"{path} not found: use a source checkout (pip install -e .)")
    spec = importlib.util.spec_from_file_location(f"pw_example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
