"""Property tests of every ``python -m helpers.X`` command line: each flag's value is checked.

A bad value (out of range, of the wrong kind, or one that leaves nothing to measure) gets
exit code 2 and one line on stderr naming the flag and what it accepts, before any work
starts; a good value parses. Most examples call each CLI's parse function in-process (fast);
a few run the real command in a subprocess, and check that no traceback comes out.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.cli import host_port, whole_number, writable_path
from helpers.cluster import allreduce_probe, multiprocess
from helpers.measuring import profile
from helpers.planning import plan

ROOT = Path(__file__).resolve().parents[1]

NOT_WHOLE = st.sampled_from(["", " ", "nan", "inf", "-inf", "2.5", "1e400", "three", "0x10", "1,2"])


def bad_whole(lo: int, hi: int | None) -> st.SearchStrategy[str]:
    below = st.integers(max_value=lo - 1).map(str)
    above = st.integers(min_value=hi + 1).map(str) if hi is not None else st.nothing()
    halves = st.integers(lo, (hi or lo + 1000) - 1).map(lambda n: f"{n}.5")
    return st.one_of(below, above, halves, NOT_WHOLE)


def good_whole(lo: int, hi: int | None) -> st.SearchStrategy[str]:
    return st.integers(lo, hi if hi is not None else lo + 10_000).map(str)


BAD_PATHS = st.sampled_from(["", "/no/such/folder/out.json", str(ROOT / "tests")])
BAD_HOSTS = st.sampled_from(["localhost", "host:0", "host:65536", ":1234", "host:port", ""])

# flag -> (bad values, good values) for each entry point; `base` is what it always needs.
WHOLE = {
    "profile": {
        "--steps": (1, 100_000),
        "--warmup": (0, 100_000),
        "--devices": (1, 4096),
        "--batch-per-device": (1, None),
    },
    "multiprocess": {
        "--num-processes": (1, 65536),
        "--simulated-devices": (1, 512),
        "--steps": (1, None),
        "--log-every": (1, None),
        "--seed": (0, 2**32 - 1),
        "--heartbeat-timeout": (1, None),
        "--init-timeout": (1, None),
    },
    "plan": {
        "--gpus": (1, None),
        "--dp": (1, None),
        "--tp": (1, None),
        "--micro-batch": (1, None),
        "--seq": (1, None),
        "--grad-accum": (1, None),
    },
    "allreduce_probe": {
        "--num-processes": (1, 65536),
        "--nbytes": (4, 1 << 34),
        "--iters": (1, 100_000),
        "--init-timeout": (1, None),
        "--num-gpus": (1, 1024),
    },
}
OTHER: dict[str, dict[str, st.SearchStrategy[str]]] = {
    "profile": {
        "--json": BAD_PATHS,
        "--plot": BAD_PATHS,
        "--mesh-shape": st.sampled_from(["0,8", "2", "2,4,1", "a,b", "-1,2", ""]),
        "--strategies": st.sampled_from(["ddp", "FSDP", ""]),
        "--model": st.sampled_from(["gpt", ""]),
        "--preset": st.sampled_from(["huge", ""]),
    },
    "multiprocess": {
        "--coordinator": BAD_HOSTS,
        "--out": BAD_PATHS,
        "--mesh-figure": BAD_PATHS,
        "--layout": st.sampled_from(["tp", ""]),
    },
    "plan": {
        "--json": BAD_PATHS,
        "--zero": st.sampled_from(["4", "-1", "one", ""]),
        "--precision": st.sampled_from(["fp8", ""]),  # bf16 is pure bf16 since issue 53
        "--remat": st.sampled_from(["layer", ""]),
        "--loss": st.sampled_from(["fp32", ""]),
    },
    "allreduce_probe": {"--coordinator": BAD_HOSTS, "--platform": st.sampled_from(["tpu", ""])},
}


def _plan_parse(argv: Sequence[str]) -> Any:
    return plan._parser().parse_args(argv)  # noqa: SLF001 - what plan.main parses with


PARSE: dict[str, tuple[Callable[[Sequence[str]], Any], list[str]]] = {
    "profile": (profile.parse_args, []),
    "multiprocess": (multiprocess.parse_args, []),
    "plan": (_plan_parse, ["--params", "1e9"]),
    "allreduce_probe": (allreduce_probe.parse_args, []),
}
FLAGS = [(cli, flag) for cli, flags in WHOLE.items() for flag in flags] + [
    (cli, flag) for cli, flags in OTHER.items() for flag in flags
]


def refusal(cli: str, argv: Sequence[str]) -> str:
    """Parse ``argv`` with ``cli``'s parser: the one line it refuses with (exit code 2)."""
    parse, base = PARSE[cli]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        parse([*base, *argv])
    assert exit_.value.code == 2, (argv, err.getvalue())
    return err.getvalue()


def _is_one_line_naming(text: str, flag: str) -> bool:
    return text.endswith("\n") and text.count("\n") == 1 and flag in text


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_every_flag_refuses_a_bad_value_in_one_line_naming_it(data):
    cli, flag = data.draw(st.sampled_from(FLAGS))
    if flag in WHOLE.get(cli, {}):
        value = data.draw(bad_whole(*WHOLE[cli][flag]))
    else:
        value = data.draw(OTHER[cli][flag])
    text = refusal(cli, [f"{flag}={value}"])
    assert _is_one_line_naming(text, flag), text
    assert "Traceback" not in text


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_every_whole_number_flag_takes_a_value_in_its_range(data):
    cli, flag = data.draw(st.sampled_from([f for f in FLAGS if f[1] in WHOLE[f[0]]]))
    lo, hi = WHOLE[cli][flag]
    value = data.draw(good_whole(lo, hi))
    parse, base = PARSE[cli]
    extra = []
    if cli == "profile" and flag == "--devices":
        extra = []  # the mesh defaults to N,1: any count parses
    args = parse([*base, *extra, flag, value])
    assert getattr(args, flag.lstrip("-").replace("-", "_")) == int(value)


@pytest.mark.parametrize(
    ("cli", "argv", "flag"),
    [
        ("profile", ["--strategies", "dp", "dp"], "--strategies"),
        ("profile", ["--devices", "8", "--mesh-shape", "2,2"], "--mesh-shape"),
        ("profile", ["--json", "x.json", "--plot", "x.json"], "--plot"),
        ("multiprocess", ["--num-processes", "2", "--process-id", "2"], "--process-id"),
        ("multiprocess", ["--num-processes", "2", "--primary-host", "5"], "--primary-host"),
        ("multiprocess", ["--hold-save", "3"], "--hold-save"),
        ("multiprocess", ["--save-every", "3"], "--save-every"),
        ("allreduce_probe", ["--num-processes", "2", "--process-id", "3"], "--process-id"),
    ],
)
def test_flags_that_contradict_each_other_are_refused_naming_one(cli, argv, flag):
    assert _is_one_line_naming(refusal(cli, argv), flag)


@given(st.text(max_size=12))
def test_the_value_checkers_accept_only_what_they_say(text):
    for check in (whole_number(1, 8), host_port):
        try:
            check(text)
        except Exception as err:  # argparse.ArgumentTypeError: one sentence naming the value
            assert type(err).__name__ == "ArgumentTypeError" and repr(text) in str(err)
    with pytest.raises(ValueError, match="hi"):
        whole_number(3, 1)
    assert writable_path("-") == "-"


@pytest.mark.parametrize(
    ("module", "argv", "flag"),
    [
        ("helpers.profile", ["--devices", "0"], "--devices"),
        ("helpers.profile", ["--steps", "0", "--dry-run"], "--steps"),
        ("helpers.profile", ["--batch-per-device", "0"], "--batch-per-device"),
        ("helpers.multiprocess", ["--simulated-devices", "0"], "--simulated-devices"),
        ("helpers.plan", ["--params", "1e9", "--gpus", "0"], "--gpus"),
        ("helpers.allreduce_probe", ["--num-gpus", "0"], "--num-gpus"),
    ],
)
def test_the_real_command_exits_2_with_one_line_before_any_work(module, argv, flag):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-m", module, *argv], capture_output=True, text=True, env=env,
        timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert run.stdout == ""
    assert _is_one_line_naming(run.stderr, flag) and "Traceback" not in run.stderr


def documented_commands() -> set[str]:
    """Every ``python -m helpers.X`` the documentation, the notebooks and the helpers name."""
    texts = [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
    texts += sorted((ROOT / "notebooks" / "src").glob("*.md"))
    texts += sorted((ROOT / "helpers").rglob("*.py"))
    found = set()
    for path in texts:
        found |= set(re.findall(r"python -m (helpers(?:\.\w+)+)", path.read_text()))
    return found - {"helpers.X"}  # the placeholder of helpers/cli.py and CONTRIBUTING.md


def test_every_documented_command_runs_where_the_documentation_says():
    """The code lives in a subpackage (helpers/measuring/profile.py, ...); the command a
    learner types stays the documented one, and its --help names it."""
    commands = documented_commands()
    assert {"helpers.profile", "helpers.plan", "helpers.multiprocess"} <= commands
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for module in sorted(commands):
        run = subprocess.run(
            [sys.executable, "-W", "error::RuntimeWarning", "-m", module, "--help"],
            capture_output=True, text=True, env=env, timeout=120, cwd=ROOT,
        )  # fmt: skip
        assert run.returncode == 0, (module, run.stderr)
        assert run.stdout.startswith(f"usage: python -m {module} "), (module, run.stdout[:80])


@pytest.mark.parametrize(
    ("short", "long"),
    [
        ("helpers.profile", "helpers.measuring.profile"),
        ("helpers.plan", "helpers.planning.plan"),
        ("helpers.multiprocess", "helpers.cluster.multiprocess"),
        ("helpers.allreduce_probe", "helpers.cluster.allreduce_probe"),
    ],
)
def test_the_long_path_of_a_command_runs_it_as_the_short_one_does(short, long):
    """``python -m helpers.measuring.profile`` is the same command as ``python -m
    helpers.profile``, not a module that imports and exits 0 saying nothing."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runs = [
        subprocess.run(
            [sys.executable, "-W", "error::RuntimeWarning", "-m", module, *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            cwd=ROOT,
        )
        for module in (short, long)
        for argv in (["--help"], ["--no-such-flag"])
    ]
    short_help, short_bad, long_help, long_bad = runs
    assert long_help.returncode == short_help.returncode == 0, long_help.stderr
    assert long_help.stdout == short_help.stdout and long_help.stdout.startswith("usage: ")
    assert long_bad.returncode == short_bad.returncode == 2
    assert long_bad.stderr == short_bad.stderr != ""
