"""Tests of helpers.planning.plan: the ZeRO paper's Fig. 1, published parameter counts, Hugging Face
configs, and the command line's one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.planning.plan import (
    HARDWARE,
    JSON_KEYS,
    NAMED_MODELS,
    PUBLISHED_PARAMS,
    PlanError,
    main,
    model_from_hf_config,
    plan_model,
)

ROOT = Path(__file__).resolve().parents[1]

# Rajbhandari et al. 2019 (arXiv:1910.02054), Fig. 1: 7.5B parameters, N_d = 64, K = 12.
ZERO_FIG1_GB = {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.9}
ZERO_FORMULA_GB = {0: 120.0, 1: 31.41, 2: 16.64, 3: 1.875}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "helpers.plan", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_paper_fig1_from_the_command_line(stage: int) -> None:
    out = _cli("--params", "7.5e9", "--dp", "64", "--zero", str(stage), "--json", "-")
    assert out.returncode == 0, out.stderr
    states = json.loads(out.stdout)["per_device_bytes"]["total"] / 1e9
    assert states == pytest.approx(ZERO_FORMULA_GB[stage], rel=1e-3)
    # The paper prints rounded numbers; 1.875 is within 1.4% of its "1.9".
    assert states == pytest.approx(ZERO_FIG1_GB[stage], rel=0.015)


@pytest.mark.parametrize("name", sorted(NAMED_MODELS))
def test_named_models_match_their_published_totals(name: str) -> None:
    published, source = PUBLISHED_PARAMS[name]
    assert source
    assert NAMED_MODELS[name].param_count() == pytest.approx(published, rel=0.005)


def test_mixtral_active_parameters_match_the_published_count() -> None:
    # mistral.ai/news/mixtral-of-experts: "only uses 12.9B parameters per token".
    assert NAMED_MODELS["mixtral-8x7b"].active_params() == pytest.approx(12.9e9, rel=0.005)


def test_json_has_the_documented_keys_and_help_lists_them() -> None:
    out = _cli("--config", "llama3-8b", "--dp", "8", "--zero", "3", "--json", "-")
    data = json.loads(out.stdout)
    assert set(data) == set(JSON_KEYS)
    assert set(data["per_device_bytes"]) == {"params", "grads", "optimizer", "activations", "total"}
    help_text = _cli("--help").stdout
    for key in JSON_KEYS:
        assert key in help_text


def test_the_table_prints_fast() -> None:
    out = _cli("--config", "llama3-8b", "--dp", "8", "--zero", "3", "--hardware", "h100")
    assert out.returncode == 0 and "per device" in out.stdout and "fits" in out.stdout


HF_LLAMA = {
    "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
    "tie_word_embeddings": False,
}  # fmt: skip


def test_a_hugging_face_config_reads_like_the_named_model(tmp_path: Path) -> None:
    assert model_from_hf_config(HF_LLAMA).param_count() == NAMED_MODELS["llama3-8b"].param_count()
    mixtral = {**HF_LLAMA, "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2}
    spec = model_from_hf_config(mixtral)
    assert spec.param_count() == NAMED_MODELS["mixtral-8x7b"].param_count()
    tied = model_from_hf_config({**HF_LLAMA, "tie_word_embeddings": True})
    assert tied.param_count() == spec_count(HF_LLAMA) - 4096 * 128256
    path = tmp_path / "config.json"
    path.write_text(json.dumps(HF_LLAMA))
    assert _cli("--config", str(path)).returncode == 0


def spec_count(cfg: dict[str, int]) -> int:
    return model_from_hf_config(cfg).param_count()


@pytest.mark.parametrize("key", ["hidden_size", "num_key_value_heads", "vocab_size"])
def test_a_missing_key_is_named(tmp_path: Path, key: str) -> None:
    cfg = {k: v for k, v in HF_LLAMA.items() if k != key}
    with pytest.raises(ValueError, match=f"missing key '{key}'"):
        model_from_hf_config(cfg)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    out = _cli("--config", str(path))
    assert out.returncode == 2 and key in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--config", "llama3-8b", "--dp", "3", "--gpus", "8"], "--gpus"),
        (["--config", "llama3-8b", "--tp", "3"], "--tp"),
        (["--config", "llama3-70b", "--pp", "3"], "--pp"),
        (["--config", "mixtral-8x7b", "--ep", "3"], "--ep"),
        (["--config", "llama3-8b", "--cp", "3"], "--cp"),
        (["--config", "no-such-model"], "--config"),
        (["--config", "llama3-8b", "--hardware", "b200"], "--hardware"),
        (["--params", "7e9", "--tp", "2"], "--tp"),
        (["--config", "llama3-8b", "--zero", "4"], "--zero"),
        (["--config", "llama3-8b", "--dp", "0"], "--dp"),
    ],
)
def test_a_configuration_that_cannot_run_is_one_line_and_exit_2(
    args: list[str], named: str
) -> None:
    out = _cli(*args)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and named in out.stderr
    assert "Traceback" not in out.stderr


def test_zero_stages_order_and_dp_traffic() -> None:
    stages = [plan_model("llama3-8b", dp=8, zero=z) for z in range(4)]
    totals = [p.per_device_bytes["total"] for p in stages]
    assert totals == sorted(totals, reverse=True)
    # ZeRO-1 and -2 send what DP sends; ZeRO-3 sends half as much again (Rajbhandari et al.).
    dp = stages[0].comm_bytes_per_step["dp"]
    assert stages[1].comm_bytes_per_step["dp"] == stages[2].comm_bytes_per_step["dp"] == dp
    assert stages[3].comm_bytes_per_step["dp"] == pytest.approx(1.5 * dp)


def test_tensor_and_pipeline_divide_the_parameters() -> None:
    one = plan_model("llama3-70b").per_device_bytes["params"]
    split = plan_model("llama3-70b", tp=8, pp=2).per_device_bytes["params"]
    assert one / 16 < split < one / 15


def test_every_hardware_is_cited() -> None:
    for hw in HARDWARE.values():
        assert hw.source and hw.peak_flops > 1e14 and hw.hbm_bytes > 7e10


def test_plan_errors_are_value_errors() -> None:
    with pytest.raises(PlanError, match="--tp"):
        plan_model("llama3-8b", tp=16)
    assert main(["--config", "llama3-8b"]) == 0
