"""Tests of helpers.measuring.cost_model: peaks, units, bytes, phase times, knees and the scaling-book rule.

The formulas are checked against hand arithmetic here; tests/test_profile.py checks the
unit counts against the bytes of steps XLA compiled.
"""

import dataclasses

import numpy as np
import pytest

from helpers.measuring import cost_model as cm
from helpers.placing.models import ModelConfig, TransformerConfig

GPU = ModelConfig(d_model=4096, d_ff=16384, n_layers=4, n_classes=128, batch=8, seq=2048)
H100 = 989e12


@pytest.mark.parametrize(
    ("kind", "name", "peak"),
    [
        ("NVIDIA H200", "H200 SXM", 989e12),
        ("NVIDIA H200 NVL", "H200 NVL", 835e12),
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989e12),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", "H100 NVL", 835e12),
        ("NVIDIA A100-SXM4-80GB", "A100", 312e12),
        ("NVIDIA A100-PCIE-40GB", "A100", 312e12),
        ("NVIDIA L4", "L4", 121e12),
        ("Tesla T4", "T4 (FP16 peak)", 65e12),
        ("NVIDIA B200", "B200", 2.25e15),
        # what JAX names each TPU (device_kind): "TPU v5 lite" is a v5e, "TPU v5" a v5p
        ("TPU v2", "TPU v2", 46e12),
        ("TPU v3", "TPU v3", 123e12),
        ("TPU v4", "TPU v4", 275e12),
        ("TPU v5 lite", "TPU v5e", 197e12),
        ("TPU v5", "TPU v5p", 459e12),
        ("TPU v5p", "TPU v5p", 459e12),
        ("TPU v6 lite", "TPU v6e", 918e12),
    ],
)
def test_peak_table_matches_device_kinds(kind, name, peak):
    assert cm.peak_flops(kind) == (name, peak)


@pytest.mark.parametrize("kind", ["cpu", "NVIDIA L40S", "NVIDIA GeForce RTX 4090", "TPU v7x"])
def test_unknown_devices_have_no_peak(kind):
    assert cm.peak_flops(kind) is None


def test_every_peak_has_a_source_and_the_planner_reads_the_same_table():
    from helpers.planning.hardware import HARDWARE

    names = [p.name for p in cm.PEAKS]
    assert len(names) == len(set(names))
    for p in cm.PEAKS:
        assert p.flops > 0 and len(p.source) > 20, p
    # the accelerators learners have: Colab's, the TPUs, the big GPUs
    for kind in ("Tesla T4", "NVIDIA L4", "NVIDIA A100-SXM4-40GB", "TPU v2", "TPU v3", "TPU v4",
                 "TPU v5 lite", "TPU v5p", "TPU v6 lite", "NVIDIA H100 80GB HBM3", "NVIDIA H200",
                 "NVIDIA B200"):  # fmt: skip
        assert cm.peak_of(kind) is not None, kind
    for hw in HARDWARE.values():  # one table: each planner entry's peak is a PEAKS figure
        assert hw.peak_flops in {p.flops for p in cm.PEAKS}, hw.name


def test_bandwidths_are_one_way_halves_of_the_datasheet_totals():
    assert cm.INTERCONNECTS["NVLink 4 (H100/H200 SXM)"] * 2 == 900e9
    assert cm.INTERCONNECTS["NVLink 3 (A100 SXM)"] * 2 == 600e9
    assert cm.PCIE5_X16 * 2 == 128e9 and cm.PCIE4_X16 * 2 == 64e9


def test_flops_per_token_splits_six_into_two_and_four_and_remat_adds_two():
    matmul_params = 4 * 2 * 4096 * 16384 + 4096 * 128
    assert cm.flops_per_token(GPU) == (2 * matmul_params, 4 * matmul_params)
    assert cm.flops_per_token(GPU).total * GPU.batch * GPU.seq == GPU.train_flops_per_step()
    assert cm.flops_per_token(GPU, remat=True) == (2 * matmul_params, 6 * matmul_params)
    # Per token: the batch does not matter.
    assert cm.flops_per_token(dataclasses.replace(GPU, batch=1)) == cm.flops_per_token(GPU)


# The Transformer preset of helpers.measuring.profile (gpu), in f32: attention is 6% of its FLOPs.
LM = TransformerConfig(
    vocab_size=50257, d_model=2048, n_heads=16, head_dim=128, d_ff=8192, n_layers=8,
    batch=8, seq=1024, vocab_multiple=128,
)  # fmt: skip


def test_flops_per_token_splits_attention_a_third_forward_like_the_matmuls():
    """Attention's FLOPs are not 6 x any parameters, but they split 1:2 all the same."""
    n = LM.matmul_params()
    attention = 12 * LM.n_layers * LM.n_heads * LM.head_dim * LM.seq  # PaLM, per token
    forward, backward = cm.flops_per_token(LM)
    assert forward == pytest.approx(2 * n + attention / 3, rel=1e-12)
    assert backward == pytest.approx(4 * n + 2 * attention / 3, rel=1e-12)
    assert (forward + backward) * LM.batch * LM.seq == pytest.approx(LM.train_flops_per_step())
    assert cm.flops_per_token(LM, remat=True).backward == pytest.approx(6 * n + attention)
    # Per token, the batch does not matter; the sequence does (attention grows with it).
    assert cm.flops_per_token(dataclasses.replace(LM, batch=1)) == cm.flops_per_token(LM)
    longer = cm.flops_per_token(dataclasses.replace(LM, seq=2048)).total
    assert longer - cm.flops_per_token(LM).total == pytest.approx(attention)


def test_the_forward_phase_is_a_third_of_what_xla_counts_for_a_transformer():
    """XLA's own counts of a small Transformer whose attention is 22% of its FLOPs: the
    forward pass alone, and the whole gradient, each land just above the phase the cost
    model gives (elementwise work on top). Counting the forward as 2 x matmul parameters
    per token would miss a third of attention's FLOPs there: XLA would count 1.34 x it."""
    import flax.linen as nn
    import jax

    from helpers import compat
    from helpers.placing.models import cross_entropy, synthetic_tokens

    cfg = TransformerConfig(
        vocab_size=256, d_model=64, n_heads=4, head_dim=16, d_ff=256, n_layers=2, batch=2, seq=128
    )
    model = cfg.model()
    x, y = synthetic_tokens(jax.random.key(0), cfg)
    params = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), x))["params"]
    forward = compat.cost_flops(
        jax.jit(lambda p: model.apply({"params": p}, x)).lower(params).compile()
    )
    grad = jax.jit(jax.grad(lambda p: cross_entropy(model.apply({"params": p}, x), y)))
    step = compat.cost_flops(grad.lower(params).compile())
    if forward is None or step is None:
        pytest.skip("this backend has no cost analysis")
    tokens, phases = cfg.batch * cfg.seq, cm.flops_per_token(cfg)
    assert 1.0 <= forward / (tokens * phases.forward) < 1.1
    assert 1.0 <= (step - forward) / (tokens * phases.backward) < 1.1
    assert forward / (tokens * 2 * cfg.matmul_params()) > 1.3  # parameters alone: wrong


def test_units_per_strategy_phase_keep_gathered_and_backend():
    assert cm.comm_units("dp") == (0, 2)
    assert cm.comm_units("dp", keep_gathered=True, reduce_scatter=False) == (
        0,
        2,
    )  # nothing gathered
    # Textbook FSDP (ZeRO-3): gathered, freed, gathered again, reduce-scattered: 3 units.
    assert cm.comm_units("fsdp") == (1, 2)
    assert cm.comm_units("fsdp").total == 1.5 * cm.comm_units("dp").total  # the ZeRO paper's 1.5x
    assert cm.comm_units("fsdp", keep_gathered=True) == (1, 1)  # the copy kept: 2 units
    assert cm.comm_units("fsdp", keep_gathered=True, reduce_scatter=False) == (1, 2)  # XLA:CPU
    assert cm.comm_units("fsdp", reduce_scatter=False).total == 4
    assert cm.comm_units("fsdp_all") == cm.comm_units("fsdp")
    with pytest.raises(TypeError):
        cm.comm_units("fsdp", remat=True)  # remat changes FLOPs, not traffic
    with pytest.raises(ValueError, match="no cost model for strategy='tp'"):
        cm.comm_units("tp")


def test_comm_bytes_and_time_are_units_of_a_ring_all_gather():
    assert cm.comm_bytes("dp", 1000, 4, bytes_per_param=2) == (0, 2 * 1000 * 2 * 0.75)
    assert cm.comm_bytes("fsdp", 1000, 4, 2) == (1500, 3000)
    assert cm.comm_bytes("fsdp", 1000, 4, 2, keep_gathered=True) == (1500, 1500)
    assert cm.comm_bytes("fsdp", 1000, 1).total == 0  # one device sends nothing
    assert cm.comm_bytes("fsdp", 1000, 4).total == 2 * cm.comm_bytes("fsdp", 1000, 4, 2).total
    t = cm.comm_time("fsdp", 10**9, 8, 450e9, 2, keep_gathered=True)
    assert t.forward == pytest.approx(2e9 * 7 / 8 / 450e9) and t.backward == t.forward
    assert cm.comm_time("fsdp", 10**9, 8, 450e9, 2).backward == pytest.approx(2 * t.forward)


def test_the_cost_model_runs_without_numpy_on_plain_numbers():
    """The planner imports the cost model in a bare Python (no numpy) and in Pyodide."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, importlib.util; sys.modules['numpy'] = None\n"
        "spec = importlib.util.spec_from_file_location('cm', 'helpers/measuring/cost_model.py')\n"
        "cm = importlib.util.module_from_spec(spec); spec.loader.exec_module(cm)\n"
        "net = cm.DGX_H100\n"
        "print(cm.ring_time('all-gather', 1e9, 16, net), cm.comm_time('hsdp', 10**9, 64, net).total)\n"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60,
        env={"PYTHONPATH": str(root), "PATH": ""},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.split()) == 2


def test_step_cost_overlaps_within_each_phase_only():
    c = cm.step_cost(GPU, "dp", 8, H100, cm.NVLINK4, 2)
    tokens = GPU.batch * GPU.seq
    assert c.compute.total == pytest.approx(GPU.train_flops_per_step() / H100)
    assert c.compute.forward == pytest.approx(tokens * cm.flops_per_token(GPU).forward / H100)
    assert c.comm == cm.comm_time("dp", GPU.param_count(), 8, cm.NVLINK4, 2)
    assert c.compute_bound and c.step_s == pytest.approx(c.compute.total)
    assert c.serial_s == pytest.approx(c.compute.total + c.comm.total)
    # Few tokens: DP's all-reduce cannot hide behind the forward pass.
    small = cm.step_cost(GPU, "dp", 8, H100, cm.PCIE4_X16, 2, tokens=256)
    assert not small.compute_bound
    assert small.step_s == pytest.approx(small.compute.forward + small.comm.backward)
    # tokens may be an array: one step per entry.
    many = cm.step_cost(GPU, "fsdp", 8, H100, cm.NVLINK4, 2, tokens=np.array([256, 65536]))
    assert many.step_s.shape == (2,) and list(many.compute_bound) == [False, True]


def test_the_knee_is_c_over_w_for_dp_fsdp_and_remat_alike():
    c_over_w = cm.compute_bound_tokens(H100, cm.NVLINK4)
    assert c_over_w == pytest.approx(2197.8, rel=1e-4)
    ratio = GPU.param_count() / (GPU.train_flops_per_step() / (6 * GPU.batch * GPU.seq))
    for strategy, remat, keep in (
        ("dp", False, False),
        ("fsdp", False, True),
        ("fsdp", True, False),
    ):
        kw = {"remat": remat, "keep_gathered": keep}
        k = cm.knee_tokens(GPU, strategy, 8, H100, cm.NVLINK4, 2, **kw)
        assert k == pytest.approx(c_over_w * 7 / 8 * ratio)
        below = cm.step_cost(GPU, strategy, 8, H100, cm.NVLINK4, 2, tokens=0.99 * k, **kw)
        above = cm.step_cost(GPU, strategy, 8, H100, cm.NVLINK4, 2, tokens=1.01 * k, **kw)
        assert above.compute_bound and not below.compute_bound
    # Textbook FSDP without remat: 2 units against the backward's 4 FLOPs per parameter and
    # token, the same knee again.
    assert cm.knee_tokens(GPU, "fsdp", 8, H100, cm.NVLINK4, 2) == pytest.approx(
        c_over_w * 7 / 8 * ratio
    )
    # f32 on the wire doubles it; the CPU backend's all-reduce keeps FSDP's knee (the
    # backward pass then binds as tightly as the forward one).
    k2 = cm.knee_tokens(GPU, "fsdp", 8, H100, cm.NVLINK4, 2, keep_gathered=True)
    assert cm.knee_tokens(GPU, "fsdp", 8, H100, cm.NVLINK4, 4, keep_gathered=True) == pytest.approx(
        2 * k2
    )
    assert cm.knee_tokens(
        GPU, "fsdp", 8, H100, cm.PCIE5_X16, 2, keep_gathered=True
    ) == pytest.approx(k2 * cm.NVLINK4 / cm.PCIE5_X16)


def test_below_the_knee_fsdp_spreads_its_bytes_over_both_phases():
    k = cm.knee_tokens(GPU, "dp", 8, H100, cm.NVLINK4, 2)
    step = {
        (s, keep): cm.step_cost(
            GPU, s, 8, H100, cm.NVLINK4, 2, tokens=k / 4, keep_gathered=keep
        ).step_s
        for s, keep in (("dp", False), ("fsdp", True), ("fsdp", False))
    }
    assert step[("fsdp", True)] < step[("dp", False)] < step[("fsdp", False)]
    # With no tokens at all, the step is all communication: 2, 2 and 3 units.
    unit = GPU.param_count() * 2 * 7 / 8 / cm.NVLINK4
    zero = cm.step_cost(GPU, "fsdp", 8, H100, cm.NVLINK4, 2, tokens=0.0)
    assert zero.step_s == pytest.approx(3 * unit)


# --- two tiers, HSDP, latency, the optimizer step -------------------------------------


def test_the_cross_node_knee_is_the_scaling_books():
    """gpus.md, "Data Parallelism": within a node C/W = 990e12/450e9 = 2200 tokens; across
    nodes 990e12/400e9 = 2475 (node egress, 8 x 400 Gb/s). bf16 on the wire, no latency."""
    net = cm.DGX_H100._replace(latency=(0.0, 0.0, 0.0))
    assert cm.DGX_H100_NODE == 400e9
    model = GPU
    ratio = model.param_count() / (model.train_flops_per_step() / (6 * model.batch * model.seq))
    inside = cm.knee_tokens(model, "dp", 8, 990e12, net, 2) / ratio
    assert inside == pytest.approx(2200 * 7 / 8, rel=1e-3)
    many = cm.knee_tokens(model, "dp", 8 * 4096, 990e12, net, 2) / ratio
    assert many == pytest.approx(2475, rel=1e-3)
    # Two nodes: the node level binds (the book's 2-way all-gather answer), not (X-1)/X
    # of the cross-node tier alone.
    two = cm.knee_tokens(model, "dp", 16, 990e12, net, 2) / ratio
    assert two == pytest.approx(inside)
    # f32 on the wire doubles every knee.
    assert cm.knee_tokens(model, "dp", 64, 990e12, net, 4) == pytest.approx(
        2 * cm.knee_tokens(model, "dp", 64, 990e12, net, 2)
    )


def test_a_slow_nic_moves_the_knee_when_the_ring_leaves_the_node():
    one_nic = cm.Network(cm.NVLINK4, cm.IB_NDR_400, 8)  # one 400 Gb/s NIC per node
    k = [cm.knee_tokens(GPU, "fsdp", n, H100, one_nic, 2, keep_gathered=True) for n in (8, 16, 64)]
    assert k[1] > 4 * k[0] and k[2] > k[1]
    # HSDP keeps its forward gather inside the node: only the backward binds across nodes.
    h = cm.step_cost(GPU, "hsdp", 64, H100, one_nic, 2, tokens=1.0, keep_gathered=True)
    f = cm.step_cost(GPU, "fsdp", 64, H100, one_nic, 2, tokens=1.0, keep_gathered=True)
    assert h.comm.forward < f.comm.forward / 4


def test_ring_time_by_hand():
    net = cm.Network(400e9, 100e9, 4, (1e-5, 1e-6, 1e-5))
    # 8 devices = 2 nodes of 4: NVLink (3/4 x 1 GB / 400 GB/s) against NICs (1/2 x 1 GB / 100 GB/s)
    t = cm.ring_time("all-gather", 1e9, 8, net)
    assert t == pytest.approx(max(0.75e9 / 400e9, 0.5e9 / 100e9) + 1e-5 + 6 * 1e-6 + 1 * 1e-5)
    t = cm.ring_time("all-reduce", 1e9, 8, net)
    assert t == pytest.approx(2 * 0.5e9 / 100e9 + 1e-5 + 12 * 1e-6 + 2 * 1e-5)
    # One flat ring through all 8 GPUs sends 7/8 of the array out of each node, not 1/2.
    flat = net._replace(cross_node="flat")
    t = cm.ring_time("all-gather", 1e9, 8, flat)
    assert t == pytest.approx(0.875e9 / 100e9 + 1e-5 + 6 * 1e-6 + 1 * 1e-5)
    assert cm.ring_time("all-gather", 1e9, 4, flat) == cm.ring_time("all-gather", 1e9, 4, net)
    with pytest.raises(ValueError, match="cross_node"):
        cm.ring_time("all-gather", 1e9, 8, net._replace(cross_node="tree"))
    assert cm.ring_time("all-gather", 1e9, 1, net) == 0
    with pytest.raises(ValueError, match="n_devices=6 spans nodes of 4"):
        cm.ring_time("all-gather", 1e9, 6, net)
    with pytest.raises(ValueError, match="kind='psum'"):
        cm.ring_time("psum", 1e9, 4, net)
    with pytest.raises(ValueError, match="bandwidth"):
        cm.ring_time("all-gather", 1e9, 4, cm.Network(0.0))


def test_latency_makes_small_messages_cost_and_n_ops_pays_it_per_collective():
    tiny = dataclasses.replace(GPU, d_model=8, d_ff=8, n_classes=8)
    t1 = cm.comm_time("fsdp", tiny.param_count(), 8, cm.DGX_H100, 2)
    assert t1.forward > cm.NCCL_RING_LATENCY[0]
    t4 = cm.comm_time("fsdp", tiny.param_count(), 8, cm.DGX_H100, 2, n_ops=4)
    assert t4.forward == pytest.approx(4 * t1.forward, rel=1e-3)
    # A float bandwidth keeps the old single-tier, latency-free model.
    assert cm.comm_time("fsdp", 10**6, 8, cm.NVLINK4, 2).forward == pytest.approx(
        10**6 * 2 * 7 / 8 / cm.NVLINK4
    )


def test_the_optimizer_step_is_dp_traffic_divided_by_the_shard():
    p = GPU.param_count()
    assert cm.optimizer_bytes("dp", p, 8) == 28 * p
    assert cm.optimizer_bytes("fsdp", p, 8) == pytest.approx(28 * p / 8)
    assert cm.optimizer_bytes("hsdp", p, 32, cm.DGX_H100) == pytest.approx(28 * p / 8)
    hbm = cm.HBM_BANDWIDTH["H100 SXM"]
    dp = cm.step_cost(GPU, "dp", 8, H100, cm.NVLINK4, 2, hbm_bandwidth=hbm)
    fsdp = cm.step_cost(GPU, "fsdp", 8, H100, cm.NVLINK4, 2, hbm_bandwidth=hbm)
    assert dp.optimizer == pytest.approx(28 * p / hbm)
    assert fsdp.optimizer == pytest.approx(dp.optimizer / 8)
    assert dp.step_s - cm.step_cost(GPU, "dp", 8, H100, cm.NVLINK4, 2).step_s == pytest.approx(
        dp.optimizer
    )
    with pytest.raises(ValueError, match="hbm_bandwidth"):
        cm.step_cost(GPU, "dp", 8, H100, cm.NVLINK4, 2, hbm_bandwidth=0)
