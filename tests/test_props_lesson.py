"""Property-based tests of helpers.lesson: expect_error, check, and the exercise pattern."""

from __future__ import annotations

import contextlib
import io
import re

import nbformat
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.lesson import (
    NOT_ATTEMPTED,
    RIGHT,
    WRONG,
    check,
    exercises,
    expect_error,
    is_stub,
    one_line,
)


@contextlib.contextmanager
def printed():
    """What the block prints, fresh for every generated example (capsys is not)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        yield buf


ERRORS = st.sampled_from(
    [ValueError, TypeError, KeyError, RuntimeError, AssertionError, IndexError]
)
messages = st.text(st.characters(blacklist_categories=("Cs",)), max_size=300)


@given(ERRORS, messages)
def test_expect_error_catches_its_error_and_prints_one_line(kind, message):
    with printed() as buf, expect_error(kind) as caught:
        raise kind(message)
    out = buf.getvalue()
    assert out.startswith("Error, as expected: " + kind.__name__)
    assert isinstance(caught.error, kind)
    assert "\n" not in caught.line and caught.line.startswith(kind.__name__)


@given(ERRORS, ERRORS, messages)
def test_expect_error_never_swallows_another_error(kind, other, message):
    if issubclass(other, kind):
        return
    with pytest.raises(AssertionError, match="expected to raise") as info:
        with expect_error(kind):
            raise other(message)
    assert isinstance(info.value.__cause__, other)


@given(ERRORS)
def test_expect_error_fails_when_the_error_stops_happening(kind):
    with pytest.raises(AssertionError, match="ran without error"):
        with expect_error(kind):
            pass


@given(messages, st.sampled_from(["rank", "shape", r"\d+"]))
def test_expect_error_match_is_a_search_of_the_message(message, pattern):
    found = re.search(pattern, message) is not None
    if found:
        with printed(), expect_error(ValueError, match=pattern):
            raise ValueError(message)
    else:
        with pytest.raises(AssertionError, match="does not match"):
            with expect_error(ValueError, match=pattern):
                raise ValueError(message)


@given(messages)
def test_one_line_is_one_line(message):
    line = one_line(ValueError(message))
    assert "\n" not in line and line.startswith("ValueError")


answers = st.recursive(
    st.one_of(st.integers(), st.text(max_size=5), st.none(), st.just(...)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=3), inner, max_size=3),
    ),
    max_leaves=8,
)


def _holds_ellipsis(a) -> bool:
    if a is Ellipsis:
        return True
    if isinstance(a, dict):
        return any(_holds_ellipsis(v) for v in a.values())
    if isinstance(a, list | tuple):
        return any(_holds_ellipsis(v) for v in a)
    return False


@given(answers, st.sampled_from([True, False, "the bias is split"]))
def test_check_gives_exactly_one_verdict_and_never_raises(answer, verdict):
    with printed() as buf:
        check(answer, lambda a: verdict, hint="h", right="r")
    out = buf.getvalue()
    stub = is_stub(answer)
    assert stub == _holds_ellipsis(answer)
    marks = [m for m in (NOT_ATTEMPTED, WRONG, RIGHT) if m in out]
    assert marks == [NOT_ATTEMPTED if stub else RIGHT if verdict is True else WRONG]


@given(answers.filter(lambda a: not is_stub(a)), ERRORS, messages)
def test_check_turns_a_failing_verify_into_a_verdict(answer, kind, message):
    def verify(a):
        raise kind(message)

    with printed() as buf:
        check(answer, verify)
    assert buf.getvalue().startswith(WRONG)


ROLES = st.lists(st.sampled_from([None, "md", "exercise", "check", "solution"]), max_size=10)


@given(ROLES)
def test_exercises_accepts_exactly_the_pattern(roles):
    cells = []
    for r in roles:
        if r == "md":
            cells.append(nbformat.v4.new_markdown_cell("text"))
        else:
            cells.append(nbformat.v4.new_code_cell("x = 1", metadata={"tags": [r]} if r else {}))
    code = [r for r in roles if r != "md"]
    # The oracle: scan the code cells; each 'exercise' must open exercise/check/solution.
    ok, i, found = True, 0, 0
    while i < len(code):
        if code[i] == "exercise":
            if code[i : i + 3] != ["exercise", "check", "solution"]:
                ok = False
                break
            found, i = found + 1, i + 3
        elif code[i] in ("check", "solution"):
            ok = False
            break
        else:
            i += 1
    nb = nbformat.v4.new_notebook(cells=cells)
    if ok:
        parts = exercises(nb)
        assert len(parts) == found
        for stub, chk, sol in parts:
            assert [cells[j].metadata["tags"][0] for j in (stub, chk, sol)] == [
                "exercise",
                "check",
                "solution",
            ]
    else:
        with pytest.raises(ValueError):
            exercises(nb)
