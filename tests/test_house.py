"""No function body in ``helpers/`` is over 60 lines, its docstring aside (issue 27).

A body's length is the span from its first statement after the docstring to its last,
blank lines and comments inside included: what a reader scrolls through. Nested functions
count inside their parent and on their own. ``STILL_LONG`` names the functions not split
yet, with their length; it may only shrink.
"""

from __future__ import annotations

import ast
from pathlib import Path

HELPERS = Path(__file__).resolve().parents[1] / "helpers"
MAX_BODY = 60

# Not split yet: remove a line once its function is split (the test says when it can go).
STILL_LONG: dict[str, int] = {}


def body_length(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first statement after the docstring to the end of the last one."""
    body = fn.body
    first = body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        body = body[1:]
    if not body:
        return 0
    return (body[-1].end_lineno or body[-1].lineno) - body[0].lineno + 1


def body_lengths(root: Path = HELPERS) -> dict[str, int]:
    """``{"module.function": body length}`` for every function and method under ``root``."""
    out: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                key = f"{module}.{node.name}"
                out[key] = max(out.get(key, 0), body_length(node))
    return out


def test_body_length_counts_statements_not_the_docstring() -> None:
    tree = ast.parse('def f():\n    """Doc.\n\n    More."""\n    a = 1\n\n    return a\n')
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef)
    assert body_length(fn) == 3
    only_doc = ast.parse('def g():\n    """Doc."""\n').body[0]
    assert isinstance(only_doc, ast.FunctionDef)
    assert body_length(only_doc) == 0


def test_no_function_body_over_60_lines() -> None:
    lengths = body_lengths()
    assert len(lengths) > 100, "found too few functions: is HELPERS the package?"
    too_long = {name: n for name, n in lengths.items() if n > MAX_BODY and name not in STILL_LONG}
    assert not too_long, (
        f"function bodies over {MAX_BODY} lines (docstring aside); split them into named "
        f"steps: {dict(sorted(too_long.items(), key=lambda kv: -kv[1]))}"
    )


def test_still_long_only_shrinks() -> None:
    lengths = body_lengths()
    done = [name for name in STILL_LONG if lengths.get(name, 0) <= MAX_BODY]
    assert not done, f"now {MAX_BODY} lines or fewer; remove from STILL_LONG: {done}"
    grown = {n: lengths[n] for n, was in STILL_LONG.items() if lengths.get(n, 0) > was}
    assert not grown, f"grew past their recorded length: {grown}"
