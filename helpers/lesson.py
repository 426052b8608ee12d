"""Lesson mechanics every notebook shares: errors shown on purpose, and exercise checks.

``expect_error`` runs code that is *meant* to fail and prints the one line that names the
mistake, instead of a page of red internals. Run All never stops there: Colab and VS Code
ignore Jupyter's ``raises-exception`` tag and stop at any raised error. It is also a test:
if the error does not come, or a different one does, it raises ``AssertionError``, so a
lesson about an error cannot rot silently when a library changes.

``check`` is the second of an exercise's three cells (stub, check, solution; see
CONTRIBUTING.md). It never raises, so Run All goes on, and prints one of three verdicts:
``not attempted yet`` while the stub still holds ``...``, ``✗ Not yet: <hint>`` for a wrong
answer, ``✓ Correct: <why>`` for a right one. The test suite runs every check all three ways.

The Chinese edition (``notebooks/zh/``) runs the same code with Chinese ``hint``, ``right``
and ``why`` strings (``.ci/translate.py`` writes them from the catalogues). When the strings
a call is given hold Chinese, its own words are Chinese too: ``尚未作答`` (not attempted yet),
``✗ 还不对`` (not yet), ``✓ 正确`` (correct), ``预期之中的报错`` (error, as expected). The
language travels with the strings, so this works the same in Jupyter, Colab, VS Code and under
nbclient, with no setting to make.
"""

from __future__ import annotations

import contextlib
import re
import textwrap
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["CaughtError", "cell_role", "check", "exercises", "expect_error", "is_stub", "one_line"]

NOT_ATTEMPTED = "not attempted yet"
WRONG = "✗ Not yet"
RIGHT = "✓ Correct"
# The same verdicts in the Chinese edition (see the module docstring).
NOT_ATTEMPTED_ZH = "尚未作答"
WRONG_ZH = "✗ 还不对"
RIGHT_ZH = "✓ 正确"
_WORDS = {
    "en": {
        "stub": f"{NOT_ATTEMPTED}: replace the ... in the cell above with your answer, run it, "
        "then run this cell again.",
        "wrong": WRONG,
        "right": RIGHT + ".",
        "hint": "Hint: ",
        "raised": "your answer raised ",
        "expected": "Error, as expected: ",
        "colon": ": ",
        "stop": ".",
        "space": " ",
        "devices": "This exercise needs {n} or more devices and this run has {have}: on simulated "
        "CPU devices, run with NUM_DEVICES=8 and HELPERS_REAL_DEVICES unset.",
    },
    "zh": {
        "stub": f"{NOT_ATTEMPTED_ZH}：把上面单元格里的 ... 换成你的答案，运行那个单元格，再运行本单元格。",
        "wrong": WRONG_ZH,
        "right": RIGHT_ZH + "。",
        "hint": "提示：",
        "raised": "你的答案引发了 ",
        "expected": "预期之中的报错：",
        "colon": "：",
        "stop": "。",
        "space": "",
        "devices": "这个练习需要至少 {n} 个设备，本次运行只有 {have} 个：在模拟 CPU 设备上，"
        "请设置 NUM_DEVICES=8、不设 HELPERS_REAL_DEVICES 后重新运行。",
    },
}
_WIDTH = 100
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def _language(*texts: str | None) -> str:
    """``"zh"`` when any of the messages a call was given holds Chinese, else ``"en"``."""
    return "zh" if any(t and _CJK.search(t) for t in texts) else "en"


_DOC_LINK = re.compile(r"\s*\(https?://[^)]*\)\s*$")


def one_line(error: BaseException, match: str | None = None) -> str:
    """The one meaningful line of an error: ``Type: message``.

    That is the first line of the message that matches ``match`` (a regular expression),
    or else its first non-empty line, without a trailing documentation link.
    """
    text = str(error)
    if isinstance(error, KeyError) and len(error.args) == 1 and isinstance(error.args[0], str):
        text = error.args[0]  # str() of a KeyError quotes its message
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    line = ""
    if match is not None:
        line = next((ln for ln in lines if re.search(match, ln)), "")
    if not line and lines:
        line = lines[0]
    line = _DOC_LINK.sub("", line)
    return f"{type(error).__name__}: {line}" if line else type(error).__name__


@dataclass
class CaughtError:
    """What ``expect_error`` caught: the error itself and its one meaningful line."""

    error: BaseException | None = None
    line: str = ""


@contextlib.contextmanager
def expect_error(
    expected: type[BaseException] | tuple[type[BaseException], ...],
    match: str | None = None,
    *,
    why: str | None = None,
) -> Iterator[CaughtError]:
    """Run the block, expecting it to raise ``expected``; print the error's one line.

    ``with expect_error(ValueError, match="rank"):`` runs the block and catches the
    expected error. It then prints the error's type and its one meaningful line (see
    ``one_line``), and ``why`` below it if given: the series' explanation of the mistake.
    The block's ``as`` target receives a ``CaughtError``, for a cell that wants to look
    at the error further.

    Args:
      expected: the exception class (or a tuple of them) the block must raise.
      match: a regular expression that the error's message must contain (``re.search``).
      why: one or two sentences on what the error teaches, printed after it.

    Raises:
      AssertionError: the block raised nothing, raised another type, or a message that
        ``match`` does not find. The original error, if any, is chained to it.
    """
    if not (
        isinstance(expected, type)
        and issubclass(expected, BaseException)
        or isinstance(expected, tuple)
        and expected
        and all(isinstance(e, type) and issubclass(e, BaseException) for e in expected)
    ):
        raise TypeError(
            f"expect_error: expected={expected!r} must be an exception class or a tuple of them."
        )
    names = (
        expected.__name__
        if isinstance(expected, type)
        else " or ".join(e.__name__ for e in expected)
    )
    caught = CaughtError()
    try:
        yield caught
    except expected as err:  # noqa: B030 - validated above
        if match is not None and not re.search(match, str(err)):
            raise AssertionError(
                f"expect_error: the block raised {type(err).__name__} as expected, but its "
                f"message does not match {match!r}: {one_line(err)}"
            ) from err
        caught.error, caught.line = err, one_line(err, match)
    except Exception as err:
        raise AssertionError(
            f"expect_error: the block was expected to raise {names}, but raised {one_line(err)}"
        ) from err
    else:
        raise AssertionError(
            f"expect_error: the block was expected to raise {names}, but it ran without error. "
            "The lesson around it no longer holds: has a library changed its behaviour?"
        )
    print(_wrap(_WORDS[_language(why)]["expected"] + caught.line))
    if why:
        print(_wrap(why))


def _wrap(text: str) -> str:
    return "\n".join(
        _fill_wide(p)
        if _CJK.search(p)
        else textwrap.fill(p, _WIDTH, subsequent_indent="  ", break_on_hyphens=False)
        for p in text.split("\n")
    )


_TOKEN = re.compile(r"[\x21-\u2e7f]+ *| +|[^\x21-\u2e7f ] *")  # a word or one wide character
_NO_LINE_START = "，。、；：！？）》」』”’"


def _fill_wide(paragraph: str) -> str:
    """``textwrap.fill`` for text with Chinese: a wide character counts two columns, and a
    line may break between two of them, never inside a word or before closing punctuation."""
    lines, line, width = [], "", 0
    for token in _TOKEN.findall(paragraph):
        w = sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in token.rstrip())
        if line.strip() and width + w > _WIDTH and token[0] not in _NO_LINE_START:
            lines.append(line.rstrip())
            line, width = "  ", 2
        line += token
        width += w + len(token) - len(token.rstrip())
    return "\n".join([*lines, line.rstrip()])


def is_stub(answer: Any) -> bool:
    """True when ``answer`` is ``...`` or holds ``...`` anywhere in a dict, list, tuple or set."""
    if answer is Ellipsis:
        return True
    if isinstance(answer, dict):
        return any(is_stub(k) or is_stub(v) for k, v in answer.items())
    if isinstance(answer, list | tuple | set | frozenset):
        return any(is_stub(a) for a in answer)
    return False


def check(
    answer: Any,
    verify: Callable[[Any], bool | str | None],
    *,
    hint: str = "",
    right: str = "",
    needs_devices: int = 1,
) -> None:
    """Check a learner's answer to an exercise; print the verdict; never raise.

    Args:
      answer: the value the stub cell asked for. While it is (or holds) ``...``, the check
        prints ``not attempted yet`` and nothing else.
      verify: called with ``answer``. Returns ``True`` for a right answer; ``False`` for a
        wrong one (``hint`` is printed); or a string, which is printed as what is wrong.
        An exception inside it (say, a spec that cannot place an array) counts as wrong,
        and its one line is printed.
      hint: what to look at again, printed with a wrong answer.
      right: a sentence printed with a right answer: what it shows.
      needs_devices: the fewest devices (``jax.device_count()``) on which ``verify`` can tell
        a right answer from a wrong one; with fewer, an answer gets a sentence saying so, not
        a verdict (the stub still gets ``not attempted yet``).
    """
    words = _WORDS[_language(hint, right)]
    if is_stub(answer):
        print(words["stub"])
        return
    if needs_devices > 1:
        import jax

        if (have := jax.device_count()) < needs_devices:
            print(_wrap(words["devices"].format(n=needs_devices, have=have)))
            return
    hint_line = f"\n{words['hint']}{hint}" if hint else ""
    try:
        verdict = verify(answer)
    except Exception as err:  # noqa: BLE001 - any failure of a wrong answer is a verdict
        print(_wrap(f"{words['wrong']}{words['colon']}{words['raised']}{one_line(err)}{hint_line}"))
        return
    if type(verdict).__name__ in ("bool_", "bool") or getattr(verdict, "shape", None) == ():
        # numpy's np.True_ and a 0-d jax/numpy boolean array (from `answer == x`) are
        # verdicts too
        if getattr(verdict, "dtype", None) is not None and str(verdict.dtype) != "bool":
            raise TypeError(
                f"check: verify returned {verdict!r}; it must return True, False or a message."
            )
        verdict = bool(verdict)
    if verdict is True:
        print(_wrap(words["right"] + (f"{words['space']}{right}" if right else "")))
    elif isinstance(verdict, str) and verdict:
        print(_wrap(f"{words['wrong']}{words['colon']}{verdict}{hint_line}"))
    elif verdict is False:
        hinted = f"{words['space']}{words['hint']}{hint}" if hint else ""
        print(_wrap(f"{words['wrong']}{words['stop']}{hinted}"))
    else:
        raise TypeError(
            f"check: verify returned {verdict!r}; it must return True, False or a message."
        )


# ---------------------------------------------------------------------------
# The exercise pattern in a notebook's cells (read by the tests and the site build)
# ---------------------------------------------------------------------------

ROLES = ("exercise", "check", "solution")


def cell_role(cell: Any) -> str | None:
    """``"exercise"``, ``"check"`` or ``"solution"`` for a code cell tagged so, else None."""
    if cell.get("cell_type") != "code":
        return None
    tags = cell.get("metadata", {}).get("tags", ())
    return next((r for r in ROLES if r in tags), None)


def exercises(nb: Any) -> list[tuple[int, int, int]]:
    """``(stub, check, solution)`` cell indices of every exercise of a notebook, in order.

    ``nb`` is a notebook as ``nbformat`` reads it (or its JSON dict). The three parts are
    code cells tagged ``exercise``, ``check`` and ``solution``, in that order, with no
    other code cell between them (markdown cells may stand between).

    Raises:
      ValueError: the parts are missing, out of order, or a check or solution cell
        stands outside an exercise.
    """
    cells = nb["cells"]
    code = [i for i, c in enumerate(cells) if c.get("cell_type") == "code"]
    out: list[tuple[int, int, int]] = []
    for k, i in enumerate(code):
        if cell_role(cells[i]) != "exercise":
            continue
        parts = code[k : k + 3]
        if len(parts) < 3 or [cell_role(cells[j]) for j in parts] != list(ROLES):
            raise ValueError(
                f"the exercise stub at cell {i} must be followed by a code cell tagged 'check' "
                "and then one tagged 'solution' (see CONTRIBUTING.md)"
            )
        out.append((parts[0], parts[1], parts[2]))
    loose = sum(1 for i in code if cell_role(cells[i]) in ("check", "solution"))
    if loose != 2 * len(out):
        raise ValueError("a 'check' or 'solution' cell stands outside an exercise")
    return out
