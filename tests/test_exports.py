"""Every public name of every helpers module is importable as ``from helpers import X``.

A module's public names, read off the module itself: the functions and classes defined in it
(not imported into it) whose name has no leading underscore, and what its ``__all__`` lists.
``from helpers import X`` gives the same object, and ``helpers.__all__`` names it, except for
the few names below, each with its reason. The names of modules that ``helpers/__init__.py``
imports only on first use (the models, the profile, the planner, ...) load that module then.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import helpers

ROOT = Path(__file__).resolve().parents[1]

# Modules none of whose names are re-exported, and why.
EXCLUDED_MODULES = {
    # what every ``python -m helpers.X`` parser shares: for writing a command, not for notebooks
    "helpers.cli": "the command lines' shared argument checks",
    # the script every process of a multi-process job runs; notebook 05 reads its steps off the
    # module (``multiprocess.train``), and ``train``, ``save`` or ``connect`` alone would mislead
    "helpers.cluster.multiprocess": "the multi-process script's steps",
}
# Names left out wherever they are defined, and why.
EXCLUDED_NAMES = {
    # a command's entry point and its parser: four modules define ``main``, ``python -m`` runs it
    "main": "a command's entry point",
    "parse_args": "a command's argument parser",
    "build_parser": "a command's argument parser",
    "run": "allreduce_probe's body of one process, given that command's parsed arguments",
}
# (module, name) pairs whose name ``helpers`` gives to another module's object.
SHADOWED = {
    # schedules' version reads a PipelineSchedule and the same (stages, ticks) arrays
    ("helpers.parallelism.collectives", "bubble_fraction"): "helpers.parallelism.schedules",
    # jax.lax's names here; measure's and trace's HLO opcodes there: neither is exported
    ("helpers.parallelism.collectives", "COLLECTIVES"): None,
    # the profile's mesh axes ("data", "model"); the planner's are ("pp", "dp", "ep", "cp", "tp")
    ("helpers.measuring.profile", "AXES"): None,
}


def helpers_modules() -> list[str]:
    """Every module under helpers/, subpackages' ``__init__`` files included."""
    return sorted(m.name for m in pkgutil.walk_packages(helpers.__path__, "helpers."))


def public_names(module: object) -> set[str]:
    """The functions and classes defined in ``module`` without a leading underscore, and its
    ``__all__``."""
    defined = {
        name
        for name, obj in vars(module).items()
        if not name.startswith("_")
        and (inspect.isfunction(obj) or inspect.isclass(obj))
        and obj.__module__ == module.__name__
    }
    return defined | set(getattr(module, "__all__", ()))


def expected_exports() -> dict[str, tuple[str, str]]:
    """``{name: (module it comes from, module whose object helpers gives)}``."""
    out: dict[str, tuple[str, str]] = {}
    for module_name in helpers_modules():
        if module_name in EXCLUDED_MODULES:
            continue
        for name in public_names(importlib.import_module(module_name)) - set(EXCLUDED_NAMES):
            if (module_name, name) not in SHADOWED:
                out.setdefault(name, (module_name, module_name))
    return out


def test_every_public_name_is_importable_from_helpers_as_the_same_object():
    missing, different = [], []
    for name, (module_name, _) in sorted(expected_exports().items()):
        obj = getattr(importlib.import_module(module_name), name)
        try:
            exec(f"from helpers import {name} as got", {}, ns := {})
        except ImportError:
            missing.append(f"{module_name}.{name}")
            continue
        if ns["got"] is not obj:
            different.append(f"{module_name}.{name}")
    assert not missing, f"not importable as `from helpers import X`: {missing}"
    assert not different, f"`from helpers import X` gives another object: {different}"


def test_helpers_all_lists_every_public_name_and_each_one_resolves():
    """``__all__`` holds the public names, and a few constants more that the notebooks use
    (``NVLINK4``, ``ZERO_STAGES``, ...); every name in it is there, from its own module."""
    expected = set(expected_exports())
    listed = list(helpers.__all__)
    assert len(listed) == len(set(listed)), "a name listed twice in helpers.__all__"
    assert expected <= set(listed), f"missing from __all__: {sorted(expected - set(listed))}"
    assert set(listed) <= set(dir(helpers))
    for name in listed:
        obj = getattr(helpers, name)
        owner = getattr(obj, "__module__", None)
        if owner and owner.startswith("helpers.") and name in public_names(sys.modules[owner]):
            assert getattr(sys.modules[owner], name) is obj


def test_a_shadowed_name_is_the_other_modules_object():
    for (module_name, name), winner in SHADOWED.items():
        assert name in public_names(importlib.import_module(module_name)), (module_name, name)
        if winner is None:
            assert name not in helpers.__all__
        else:
            assert getattr(helpers, name) is getattr(importlib.import_module(winner), name)


def test_every_exclusion_still_names_something():
    """An exclusion for a name or module that no longer exists goes too."""
    modules = set(helpers_modules())
    assert set(EXCLUDED_MODULES) <= modules
    everywhere = set().union(*(public_names(importlib.import_module(m)) for m in modules))
    assert set(EXCLUDED_NAMES) <= everywhere


def test_an_unknown_name_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="no_such_helper"):
        helpers.no_such_helper  # noqa: B018
    with pytest.raises(ImportError):
        exec("from helpers import no_such_helper", {})


def test_import_helpers_leaves_the_lazy_modules_unimported():
    """``import helpers`` costs what it did before the names of the models, the profile, the
    planner, the launcher and the calculator were added: those modules load on first use."""
    code = (
        "import sys, helpers; print(' '.join(m for m in helpers._LAZY_MODULES if m in sys.modules))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": ""},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == []
