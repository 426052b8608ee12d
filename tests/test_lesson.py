"""helpers.lesson: errors shown on purpose, exercise checks, and the exercise pattern."""

from __future__ import annotations

import nbformat
import pytest

from helpers.lesson import (
    NOT_ATTEMPTED,
    RIGHT,
    WRONG,
    cell_role,
    check,
    exercises,
    expect_error,
    is_stub,
    one_line,
)


def test_expect_error_prints_the_one_line_and_the_lesson(capsys):
    with expect_error(ValueError, match="rank", why="PartitionSpec() replicates any rank.") as c:
        raise ValueError("first line\n'bias' has rank 1, the spec 2 entries\nmore")
    out = capsys.readouterr().out
    assert (
        out.splitlines()[0]
        == "Error, as expected: ValueError: 'bias' has rank 1, the spec 2 entries"
    )
    assert "PartitionSpec() replicates any rank." in out
    assert isinstance(c.error, ValueError) and "rank 1" in c.line


def test_expect_error_drops_a_trailing_doc_link(capsys):
    with expect_error(KeyError):
        raise KeyError("no such parameter (https://flax.readthedocs.io/errors#x)")
    assert "https://" not in capsys.readouterr().out


def test_expect_error_fails_when_nothing_is_raised():
    with pytest.raises(AssertionError, match="ran without error"):
        with expect_error(ValueError):
            pass


def test_expect_error_fails_on_another_error_and_chains_it():
    with pytest.raises(
        AssertionError, match="expected to raise ValueError, but raised TypeError"
    ) as e:
        with expect_error(ValueError):
            raise TypeError("wrong kind")
    assert isinstance(e.value.__cause__, TypeError)


def test_expect_error_fails_when_the_message_does_not_match():
    with pytest.raises(AssertionError, match="does not match 'rank'"):
        with expect_error(ValueError, match="rank"):
            raise ValueError("something else")


def test_expect_error_accepts_a_tuple_and_an_assertion_error(capsys):
    with expect_error((KeyError, AssertionError)):
        assert False, "acts as an assert"  # noqa: B011
    assert "AssertionError: acts as an assert" in capsys.readouterr().out


@pytest.mark.parametrize("bad", [ValueError("x"), "ValueError", (), (ValueError, 3)])
def test_expect_error_refuses_what_is_not_an_exception_class(bad):
    with pytest.raises(TypeError, match="expected="):
        with expect_error(bad):
            pass


def test_one_line_without_a_message():
    assert one_line(RuntimeError()) == "RuntimeError"


@pytest.mark.parametrize(
    ("answer", "stub"),
    [
        (..., True),
        ({"a": 1, "b": ...}, True),
        ([1, (2, ...)], True),
        (0, False),
        ({"a": None}, False),
    ],
)
def test_is_stub(answer, stub):
    assert is_stub(answer) is stub


def test_check_says_not_attempted_for_the_stub_and_never_calls_verify(capsys):
    check(..., lambda a: 1 / 0)
    assert capsys.readouterr().out.startswith(NOT_ATTEMPTED)


def test_check_steps_aside_below_needs_devices_but_not_for_the_stub(capsys):
    import jax

    have = jax.device_count()
    check(4, lambda a: 1 / 0, right="4 devices", needs_devices=have + 1)
    out = capsys.readouterr().out
    assert f"needs {have + 1} or more devices and this run has {have}" in out
    assert WRONG not in out and "NUM_DEVICES=8" in out
    check(..., lambda a: 1 / 0, needs_devices=have + 1)
    assert capsys.readouterr().out.startswith(NOT_ATTEMPTED)
    check(4, lambda a: a == 4, right="4 devices", needs_devices=have)  # enough devices: a verdict
    assert "4 devices" in capsys.readouterr().out
    check(4, lambda a: 1 / 0, right="四个设备", needs_devices=have + 1)
    assert "这个练习需要至少" in capsys.readouterr().out


def test_check_rejects_with_the_hint_and_confirms_with_the_reason(capsys):
    check(3, lambda a: a == 4, hint="count the devices", right="4 devices")
    check(4, lambda a: a == 4, hint="count the devices", right="4 devices")
    wrong, right = capsys.readouterr().out.strip().split("\n")
    assert wrong.startswith(WRONG) and "count the devices" in wrong
    assert right == f"{RIGHT}. 4 devices"


def test_check_prints_a_message_from_verify_and_an_error_as_a_verdict(capsys):
    check(3, lambda a: f"{a} is odd")
    check("P(x)", lambda a: int(a))
    first, second = capsys.readouterr().out.strip().split("\n")
    assert first == f"{WRONG}: 3 is odd"
    assert second.startswith(f"{WRONG}: your answer raised ValueError")


def test_check_refuses_a_verify_that_returns_nothing():
    with pytest.raises(TypeError, match="must return True, False or a message"):
        check(1, lambda a: None)


def _nb(*roles: str | None) -> dict:
    cells = []
    for r in roles:
        if r == "md":
            cells.append(nbformat.v4.new_markdown_cell("text"))
        else:
            cell = nbformat.v4.new_code_cell("x = 1")
            if r:
                cell.metadata["tags"] = [r]
            cells.append(cell)
    return nbformat.v4.new_notebook(cells=cells)


def test_exercises_finds_the_three_parts_with_markdown_between():
    nb = _nb(None, "exercise", "md", "check", "solution", None, "exercise", "check", "solution")
    assert exercises(nb) == [(1, 3, 4), (6, 7, 8)]
    assert cell_role(nb.cells[2]) is None and cell_role(nb.cells[4]) == "solution"


@pytest.mark.parametrize(
    "roles",
    [("exercise", "solution", "check"), ("exercise", None, "check", "solution"),
     ("exercise", "check"), ("check", "solution"), ("exercise", "check", "solution", "solution")],
)  # fmt: skip
def test_exercises_refuses_parts_out_of_order(roles):
    with pytest.raises(ValueError):
        exercises(_nb(*roles))


def test_check_takes_numpy_and_jax_booleans_as_verdicts(capsys):
    import jax.numpy as jnp
    import numpy as np

    check(3, lambda a: np.int64(a) == 3)
    check(3, lambda a: jnp.asarray(a) == 4)
    right, wrong = capsys.readouterr().out.strip().split("\n")
    assert right.startswith(RIGHT) and wrong.startswith(WRONG)
    with pytest.raises(TypeError, match="must return True, False or a message"):
        check(3, lambda a: np.float32(1.0))


def test_chinese_messages_get_the_chinese_verdicts(capsys):
    """The Chinese edition passes Chinese hint/right/why strings: the framing follows them."""
    from helpers.lesson import NOT_ATTEMPTED_ZH, RIGHT_ZH, WRONG_ZH

    check(..., lambda a: True, hint="数一数设备")
    check(3, lambda a: a == 4, hint="数一数设备", right="4 个设备")
    check(4, lambda a: a == 4, hint="数一数设备", right="4 个设备")
    check("x", lambda a: int(a), hint="数一数设备")
    with expect_error(ValueError, why="每个设备拿到相等的一块。"):
        raise ValueError("bad")
    out = capsys.readouterr().out.strip().split("\n")
    assert out[0].startswith(NOT_ATTEMPTED_ZH + "：") and NOT_ATTEMPTED not in out[0]
    assert out[1] == f"{WRONG_ZH}。提示：数一数设备"
    assert out[2] == f"{RIGHT_ZH}。4 个设备"
    assert (
        out[3].startswith(f"{WRONG_ZH}：你的答案引发了 ValueError") and out[4] == "提示：数一数设备"
    )
    assert out[5:] == ["预期之中的报错：ValueError: bad", "每个设备拿到相等的一块。"]


def test_english_messages_keep_the_english_verdicts(capsys):
    check(..., lambda a: True, hint="count the devices (× 2 — not ÷)")
    with expect_error(ValueError, why="Each device gets an equal block."):
        raise ValueError("bad")
    out = capsys.readouterr().out
    assert out.startswith(NOT_ATTEMPTED) and "Error, as expected: ValueError: bad" in out


def test_a_long_chinese_message_wraps_between_characters_not_inside_words(capsys):
    hint = "每个设备持有 kernel 的三分之一，以及完整的 bias；" * 6 + "最后是 all-gather。"
    check(3, lambda a: False, hint=hint)
    lines = capsys.readouterr().out.rstrip("\n").split("\n")
    assert len(lines) > 1 and all(line.startswith("  ") for line in lines[1:])
    assert "".join(line.strip() for line in lines).replace(" ", "") == (
        f"✗还不对。提示：{hint}".replace(" ", "")
    )
    assert all(not line.lstrip().startswith(("，", "；", "。")) for line in lines[1:])
    assert all(len(line) < 100 for line in lines), lines  # < 100 characters: ~100 columns
