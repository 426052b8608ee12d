"""What ``pip install .`` puts in the wheel: helpers and every subpackage of it.

The Colab bootstrap installs ``flax-sharding-helpers @ git+URL``, not editable, so a
subpackage that pyproject.toml's package list misses is absent on Colab and every notebook
that imports from it fails there, while editable installs and the tests (which import from
the checkout) still pass. These tests ask setuptools what it would package.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[1]


def packaged() -> set[str]:
    """The packages setuptools finds with pyproject.toml's ``[tool.setuptools.packages.find]``."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    find = config["packages"]["find"]
    return set(
        find_packages(where=str(ROOT), include=find["include"], exclude=find.get("exclude", ()))
    )


def on_disk() -> set[str]:
    """Every folder under helpers/ that holds Python code, as a dotted package name."""
    folders = {p.parent for p in (ROOT / "helpers").rglob("*.py") if "__pycache__" not in p.parts}
    return {".".join(f.relative_to(ROOT).parts) for f in folders}


def test_every_folder_of_helpers_is_a_package_that_gets_installed():
    disk = on_disk()
    assert {"helpers", "helpers.placing", "helpers.measuring", "helpers.drawing"} <= disk
    for folder in disk:
        assert (ROOT / folder.replace(".", "/") / "__init__.py").is_file(), (
            f"{folder} has no __init__.py: find_packages skips it"
        )
    assert packaged() == disk


def test_nothing_outside_helpers_gets_installed():
    assert all(p == "helpers" or p.startswith("helpers.") for p in packaged())


def test_the_readme_module_table_names_every_module_where_it_lives():
    """One row per module of helpers/, named by its path under helpers/ (``placing/devices``);
    the facade and the subpackages' __init__ files, and the four modules that only keep a
    command short (``python -m helpers.profile``, ...), have none."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| module | what it holds |") :].split("\n\n")[0]
    rows = {line.split("`")[1] for line in table.splitlines()[2:]}
    commands = {"profile", "plan", "multiprocess", "allreduce_probe"}
    modules = {
        p.relative_to(ROOT / "helpers").with_suffix("").as_posix()
        for p in (ROOT / "helpers").rglob("*.py")
        if p.name != "__init__.py" and "__pycache__" not in p.parts
    }
    assert rows == modules - commands
