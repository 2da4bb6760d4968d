"""The README's Python example runs as written."""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_readme_python_example_runs():
    readme = (ROOT / "README.md").read_text()
    [code] = re.findall(r"```python\n(.*?)```", readme, re.S)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "pw.program" in result.stdout and "pw.compute" in result.stdout
    assert "0.5800257" in result.stdout     # tanh(1) ** 2
