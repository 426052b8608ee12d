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


def import_graph(root: Path = HELPERS) -> dict[str, set[str]]:
    """``{module: the helpers modules it imports}``, by dotted name under ``helpers``."""
    files = {
        ".".join(p.relative_to(root).with_suffix("").parts): p for p in sorted(root.rglob("*.py"))
    }
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
                    out.add(mod.removeprefix("helpers."))
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
    assert "profile" in graph and "draw_profile" in graph
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_result_type_lives_below_profile_and_its_plots():
    graph = import_graph()
    assert "results" in graph["profile"] and "results" in graph["draw_profile"]
    assert "profile" not in graph["draw_profile"]
    assert graph["results"] == set()


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
