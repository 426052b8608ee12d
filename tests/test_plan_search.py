"""``--search``: every layout of a GPU count, each once at its best setting, ranked by the
optimistic MFU among those that fit with the margin (issue 39, item 10)."""

from __future__ import annotations

import time

import pytest

from helpers.planning.hardware import HARDWARE
from helpers.planning.layout import PlanError
from helpers.planning.models import NAMED_MODELS
from helpers.planning.plan import plan_model
from helpers.planning.search import (
    _headroom,
    default_global_batch,
    format_search,
    search_layouts,
)


@pytest.fixture(scope="module")
def ranking():
    start = time.perf_counter()
    result = search_layouts(NAMED_MODELS["llama3-70b"], HARDWARE["h100"], 64, top=10)
    return result, time.perf_counter() - start


def test_the_search_is_fast_and_lists_each_layout_once(ranking) -> None:
    result, took = ranking
    assert took < 10
    keys = [tuple(p.degrees.values()) for p in result.plans]
    assert len(keys) == len(set(keys)) == 10
    assert all(p.fits for p in result.plans)
    bounds = [p.mfu for p in result.plans]
    assert bounds == sorted(bounds, reverse=True)
    assert result.planned > 500 and result.global_batch == default_global_batch(64, 4096) == 256


def test_every_plan_does_the_same_work(ranking) -> None:
    result, _ = ranking
    assert {p.tokens_per_step for p in result.plans} == {256 * 4096}


def test_with_node_egress_and_no_margin_the_70b_winner_has_no_pipeline() -> None:
    """The issue's finding: on 64 H100s at a million tokens a step, with every plan allowed to
    fill HBM (margin 1), tensor parallelism inside a node and ZeRO-3 over the rest beat any
    pipeline once the NICs count at 400 GB/s a node."""
    result = search_layouts(NAMED_MODELS["llama3-70b"], HARDWARE["h100"], 64, margin=1.0)
    best = result.plans[0]
    assert best.degrees == {"pp": 1, "dp": 32, "ep": 1, "cp": 1, "tp": 2} and best.zero == 3
    assert best.crossing_axes == ["dp"]
    assert format_search(result).splitlines()[2].startswith("dp32 tp2")


def test_each_setting_keeps_room_for_its_own_calibrated_margin(ranking) -> None:
    """Issue 53: each setting gets the margin calibrated for its ZeRO stage and remat
    (``helpers.planning.margins``): ZeRO-3 without remat x1.17 (the per-op policy's torchtitan
    peaks), below the old heuristic's x1.5, so the margin-1 winner (dp 32 x tp 2, ZeRO-3, 46 GB of
    activations) now wins with room for its margin too."""
    result, _ = ranking
    best = result.plans[0]
    assert (best.degrees["dp"], best.degrees["tp"], best.zero) == (32, 2, 3)
    assert best.margin == pytest.approx(1.17) and best.margin_source != "given"
    assert all(
        p.per_device_bytes["total"]
        + (p.margin - 1) * (p.per_device_bytes["grads"] + p.per_device_bytes["activations"])
        <= p.hbm_bytes
        for p in result.plans
    )


def test_a_given_margin_applies_to_every_setting_and_moves_the_ranking() -> None:
    """With the old heuristic's x1.5 for every setting, that layout no longer fits."""
    result = search_layouts(NAMED_MODELS["llama3-70b"], HARDWARE["h100"], 64, margin=1.5, top=3)
    best = result.plans[0]
    assert (best.degrees["dp"], best.degrees["tp"], best.zero) != (32, 2, 3)
    assert {p.margin for p in result.plans} == {1.5}
    assert "the margin x1.5" in format_search(result).splitlines()[0]


def test_a_search_that_nothing_fits_says_so() -> None:
    with pytest.raises(PlanError, match="no layout"):
        search_layouts(NAMED_MODELS["llama3-405b"], HARDWARE["h100"], 8)


def test_the_table_says_what_it_leaves_out_and_explains_only_what_it_shows(ranking) -> None:
    result, _ = ranking
    text = format_search(result)
    lines = text.splitlines()
    assert "'tight': measure it) is left out" in lines[0] and "--margin 1" in lines[0]
    assert "calibrated per ZeRO stage and remat" in lines[0]
    assert "GB/dev, no margin" in lines[1]
    uses_3k = any(p.options["keep_gathered"] for p in result.plans)
    assert ("ZeRO '3k'" in text) == uses_3k
    assert not uses_3k  # the default 70B ranking keeps no gathered weights: no legend line
    total = result.plans[0].per_device_bytes["total"] / 1e9
    assert f"{total:.1f}" in lines[2]  # the column is the count, without the margin


def test_a_tie_in_mfu_goes_to_the_setting_with_more_headroom(ranking) -> None:
    """Issue 53: ZeRO-1 and ZeRO-2 give the same optimistic MFU when their data-parallel
    traffic hides; the search used to keep the first it planned (ZeRO-1, 1.1 GB left on the
    fourth layout) and now keeps the one with more room (ZeRO-2, 19.2 GB left)."""
    result, _ = ranking
    fourth = next(
        p for p in result.plans if p.degrees == {"pp": 2, "dp": 8, "ep": 1, "cp": 1, "tp": 4}
    )
    settings = dict(
        micro_batch=fourth.micro_batch, remat=fourth.remat, global_batch=256,
        virtual_stages=fourth.options["virtual_stages"], **fourth.degrees,
    )  # fmt: skip
    zero1, zero2 = (plan_model("llama3-70b", "h100", zero=z, **settings) for z in (1, 2))
    assert zero1.fits and zero2.fits and zero1.mfu == pytest.approx(zero2.mfu, rel=1e-12)
    assert _headroom(zero2) > _headroom(zero1) + 10e9
    assert fourth.zero == 2 and _headroom(fourth) == pytest.approx(_headroom(zero2))
    mfus = [p.mfu for p in result.plans]
    for a, b in zip(result.plans, result.plans[1:], strict=False):
        assert a.mfu > b.mfu or _headroom(a) >= _headroom(b)
    assert mfus == sorted(mfus, reverse=True)
