"""Property-based tests of ``python -m helpers.plan``: any flag values give a plan (exit 0)
or one line naming a flag (exit 2), never a traceback; and the plan's numbers keep their
order under changes that can only help or only hurt."""

from __future__ import annotations

import contextlib
import io
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.planning.plan import main, plan_model

FLAGS = [
    "--dp", "--tp", "--pp", "--cp", "--ep", "--gpus", "--zero", "--micro-batch", "--seq",
    "--grad-accum", "--global-batch", "--hardware", "--precision", "--grad-dtype", "--remat",
    "--virtual-stages", "--pp-layers", "--vocab-multiple", "--moe-nodes-per-token",
    "--link-gbps", "--node-gbps", "--per-node", "--matmul-tflops", "--cross-node", "--margin",
    "--loss",
]  # fmt: skip
SWITCHES = ["--keep-gathered", "--no-flash", "--sequence-parallel", "--no-sequence-parallel",
            "--tp-overlap"]  # fmt: skip
VALUES = st.one_of(
    st.integers(-3, 130).map(str),
    st.sampled_from(
        ["h100", "a100", "a100-40gb", "v100", "b200", "mi300x", "tpu-v5e", "tpu-v6e", "tpu-v5p",
         "mixed", "f32", "fp32", "bf16", "none", "selective", "op", "full", "flat", "hierarchical",
         "fused", "upcast", "plain",
         "1e3", "2.5", "nan", "inf", "", "x", "-1", "0", "8", "1.3", "10,10,12", "4,4"]
    ),
)  # fmt: skip


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
    return code, out.getvalue(), err.getvalue()


@settings(deadline=None)
@given(
    st.sampled_from(
        [
            ["--config", "llama3-8b"],
            ["--config", "llama3-70b"],
            ["--config", "mixtral-8x7b"],
            ["--params", "7.5e9"],
            ["--config", "nope"],
        ]
    ),
    st.lists(st.tuples(st.sampled_from(FLAGS), VALUES), max_size=5),
    st.lists(st.sampled_from(SWITCHES), max_size=2, unique=True),
)
def test_any_flags_give_a_plan_or_one_line_naming_a_flag(
    model: list[str], flags: list[tuple[str, str]], switches: list[str]
) -> None:
    argv = [*model, *[x for pair in flags for x in (pair[0], pair[1])], *switches, "--json", "-"]
    code, out, err = _run(argv)
    assert code in (0, 2), (argv, err)
    if code == 0:
        data = json.loads(out)
        assert data["per_device_bytes"]["total"] > 0 and data["step_time_s"] > 0
        assert 0 < data["mfu"] <= 1.0 + 1e-9
        assert data["memory_verdict"] in ("fits", "tight", "out of memory")
    else:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err, err
        assert "--" in lines[0] or "argument" in lines[0], lines[0]


@given(st.integers(1, 10**12), st.sampled_from([1, 2, 4, 64]), st.sampled_from([0, 1, 2, 3]))
def test_zero_stages_never_grow_memory(n: int, dp: int, stage: int) -> None:
    from helpers.planning.plan import ModelSpec

    model = ModelSpec("n", 0, 0, 0, 0, 0, 0, params_only=n)
    before = plan_model(model, dp=dp, zero=max(stage - 1, 0)).per_device_bytes["total"]
    after = plan_model(model, dp=dp, zero=stage).per_device_bytes["total"]
    assert after <= before * (1 + 1e-12)


@settings(deadline=None, max_examples=40)
@given(
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([1, 2, 4]),
    st.sampled_from([1, 2, 8, 16]),
    st.sampled_from(["none", "selective", "full"]),
    st.booleans(),
)
def test_faster_links_never_slow_a_step_and_recompute_never_grows_memory(
    tp: int, pp: int, dp: int, remat: str, flash: bool
) -> None:
    from helpers.planning.hardware import HARDWARE, hardware_with

    kw = dict(tp=tp, pp=pp, dp=dp, remat=remat, flash_attention=flash, grad_accum=4 * pp)
    base = plan_model("llama3-70b", **kw)
    fast = plan_model("llama3-70b", hardware_with(HARDWARE["h100"], node_bw=4e12), **kw)
    assert fast.step_time_s <= base.step_time_s * (1 + 1e-12)
    assert base.mfu <= 1
    if remat != "full":
        full = plan_model("llama3-70b", **{**kw, "remat": "full"})
        assert full.per_device_bytes["activations"] <= base.per_device_bytes["activations"]
