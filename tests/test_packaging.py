"""The distribution ships every package of the source tree: `pip install .` (not only `-e .`) has them all."""

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
SKIPPED = {"tests", "lit_tests", "scripts", "build", "shared"}      # checkout tools, not the package


def _source_packages() -> set[str]:
    """The dotted names of the package's folders that hold Python modules, as `import pathways_mlir.X` names
    them."""
    names = {"pathways_mlir"}
    for module in ROOT.rglob("*.py"):
        folder = module.parent.relative_to(ROOT)
        if folder.parts and (folder.parts[0] in SKIPPED or folder.parts[0].startswith(".")
                             or "__pycache__" in folder.parts):
            continue
        names.add(".".join(("pathways_mlir", *folder.parts)))
    return names


def test_every_source_package_is_in_the_distribution():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    assert _source_packages() - listed == set()
    assert listed - _source_packages() == set()
