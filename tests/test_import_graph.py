"""The helpers' import graph has no cycle: every module can be read from the ones below it.

Edges are every ``import helpers.X`` / ``from helpers.X import ...`` / ``from helpers import
X`` (X a module) in a module, the ones inside functions too (a late import is still a
dependency). ``helpers/__init__.py`` is the facade that imports the others; a module that
takes a name from the facade itself would depend on everything, and is refused too.
"""

from __future__ import annotations

import ast
from pathlib import Path

HELPERS = Path(__file__).resolve().parents[1] / "helpers"


def module_names(root: Path = HELPERS) -> dict[str, Path]:
    """``{dotted name under helpers: file}``; a subpackage's ``__init__.py`` is the package's
    own name (``placing``), the top one stays ``__init__`` (the facade)."""
    files = {}
    for p in sorted(root.rglob("*.py")):
        parts = p.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        files[".".join(parts)] = p
    return files


def import_graph(root: Path = HELPERS) -> dict[str, set[str]]:
    """``{module: the helpers modules it imports}``, by dotted name under ``helpers``."""
    files = module_names(root)
    names = set(files)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                mod = node.module
                if mod == "helpers":
                    out |= {a.name if a.name in names else "__init__" for a in node.names}
                elif mod.startswith("helpers."):
                    pkg = mod.removeprefix("helpers.")
                    # ``from helpers.measuring import cost_model`` imports the module itself
                    out |= {f"{pkg}.{a.name}" if f"{pkg}.{a.name}" in names else pkg
                            for a in node.names}  # fmt: skip
            elif isinstance(node, ast.Import):
                out |= {a.name.removeprefix("helpers.") for a in node.names
                        if a.name.startswith("helpers.")}  # fmt: skip
        graph[name] = {m for m in out if m in names or m == "__init__"} - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_helpers_import_graph_has_no_cycle():
    graph = import_graph()
    assert "measuring.profile" in graph and "drawing.draw_profile" in graph
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_result_type_lives_below_profile_and_its_plots():
    graph = import_graph()
    profile, plots, results = "measuring.profile", "drawing.draw_profile", "measuring.results"
    assert results in graph[profile] and results in graph[plots]
    assert profile not in graph[plots]
    assert graph[results] == set()


def test_each_subpackage_only_names_its_modules():
    """A subpackage's ``__init__.py`` imports nothing, so that importing one of its modules
    loads no other (the facade, ``helpers/__init__.py``, is where names are gathered)."""
    graph = import_graph()
    packages = [n for n, p in module_names().items() if p.name == "__init__.py" and n != "__init__"]
    assert {"placing", "parallelism", "measuring", "drawing", "cluster", "planning"} <= set(
        packages
    )
    for pkg in packages:
        assert graph[pkg] == set(), (pkg, graph[pkg])


def test_the_parallelism_strategies_stand_on_compat_alone():
    """What ``helpers/parallelism/__init__.py`` says: of helpers, they import only compat."""
    graph = import_graph()
    for name, deps in graph.items():
        if name.startswith("parallelism."):
            outside = {d for d in deps if not d.startswith("parallelism")} - {"compat"}
            assert not outside, (name, outside)


def test_a_command_line_module_only_points_at_its_code():
    """``python -m helpers.X`` stays short: ``helpers/X.py`` imports ``main`` from its
    subpackage and nothing else."""
    graph = import_graph()
    for cmd, code in [("profile", "measuring.profile"), ("plan", "planning.plan"),
                      ("multiprocess", "cluster.multiprocess"),
                      ("allreduce_probe", "cluster.allreduce_probe")]:  # fmt: skip
        assert graph[cmd] == {code}, (cmd, graph[cmd])


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


# The groups, lowest first: a module imports only from its own group, from the groups
# before it, and from the shared modules at the top (compat, cli, lesson).
LAYERS = ["parallelism", "placing", "measuring", "drawing", "cluster", "planning"]
SHARED = {"compat", "cli", "lesson"}
# The one edge that goes up: the profile's command line draws its figure for --plot.
UPWARD = {("measuring.profile", "drawing.draw_profile")}


def test_each_group_imports_only_from_the_groups_below_it():
    graph = import_graph()
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = set()
    for name, deps in graph.items():
        group = name.split(".")[0]
        if group not in rank:
            continue
        for dep in deps - SHARED:
            if rank[dep.split(".")[0]] > rank[group]:
                upward.add((name, dep))
    assert upward == UPWARD
