"""helpers.parallelism.collectives: tagged blocks, what each collective does to them, closed forms,
pipeline schedules and the HLO order of a compiled program. Runs on 8 simulated devices."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from helpers import make_mesh
from helpers.measuring.measure import collective_stats
from helpers.parallelism.collectives import (
    COLLECTIVES,
    HLO_NAME,
    Block,
    blocks_by_device,
    bubble_fraction,
    chunks_for,
    expected_blocks,
    gpipe_bubble,
    gpipe_schedule,
    hlo_op_sequence,
    read_blocks,
    ring_all_gather_rounds,
    ring_bytes,
    tag_blocks,
)

N = 8


@pytest.fixture(scope="module")
def mesh():
    return make_mesh((N,), ("x",))


PROGRAMS = {
    "psum": lambda b: jax.lax.psum(b, "x"),
    "all_gather": lambda b: jax.lax.all_gather(b, "x", tiled=True),
    "psum_scatter": lambda b: jax.lax.psum_scatter(b, "x", tiled=True),
    "ppermute": lambda b: jax.lax.ppermute(b, "x", [(d, (d + 1) % N) for d in range(N)]),
    "all_to_all": lambda b: jax.lax.all_to_all(b, "x", 0, 0, tiled=True),
}


def test_tag_rows_say_device_and_chunk():
    t = tag_blocks(3, 2)
    assert t.shape == (6, 3) and t.dtype == np.float32
    assert t.tolist() == [[1, 0, 0], [2, 0, 0], [0, 1, 0], [0, 2, 0], [0, 0, 1], [0, 0, 2]]
    assert read_blocks(t) == (
        Block(0, (0,)), Block(1, (0,)), Block(0, (1,)), Block(1, (1,)), Block(0, (2,)),
        Block(1, (2,)),
    )  # fmt: skip


def test_sums_of_tags_read_back_as_sets_of_devices():
    t = tag_blocks(4, 2)
    chunk1 = t[1] + t[3] + t[7]  # chunk 1 of devices 0, 1 and 3
    assert read_blocks(chunk1[None]) == (Block(1, (0, 1, 3)),)
    everyone = t[0::2].sum(axis=0)  # chunk 0 of all four
    assert read_blocks(everyone[None])[0].label(4) == "Σa"
    assert Block(2, (1, 2)).label(8) == "c1+2" and Block(0, (0, 1, 2, 3)).label(8) == "a0..3"


def test_read_blocks_rejects_what_is_not_tagged():
    with pytest.raises(ValueError, match=r"2-D \(k, n_devices\)"):
        read_blocks(np.zeros((3,)))
    with pytest.raises(ValueError, match="row 0"):
        read_blocks(np.array([[0.0, 0.0]]))  # no device
    with pytest.raises(ValueError, match="adds different chunks"):
        read_blocks(np.array([[1.0, 2.0]]))  # chunk 0 of one device + chunk 1 of another
    with pytest.raises(ValueError, match="adds different chunks"):
        # a, b and c of devices 0, 1, 2: the total of a correct sum of chunk b, yet wrong
        read_blocks(np.array([[1.0, 2.0, 3.0]]))


@pytest.mark.parametrize("name", COLLECTIVES)
def test_each_collective_matches_its_definition_on_real_arrays(mesh, name):
    tagged = jax.device_put(tag_blocks(N, chunks_for(name, N)), NamedSharding(mesh, P("x")))
    compiled = (
        jax.jit(jax.shard_map(PROGRAMS[name], mesh=mesh, in_specs=P("x"), out_specs=P("x")))
        .lower(tagged)
        .compile()
    )
    before, after = blocks_by_device(tagged), blocks_by_device(compiled(tagged))
    assert (before, after) == expected_blocks(name, N)
    # and the compiled program moves what the closed form says
    block_bytes = tagged.addressable_shards[0].data.nbytes
    sent = collective_stats(compiled)[HLO_NAME[name]]["sent_per_device"]
    assert sent == pytest.approx(ring_bytes(name, block_bytes, N))


def test_expected_blocks_spelled_out():
    before, after = expected_blocks("all_to_all", 3)
    assert before[1] == (Block(0, (1,)), Block(1, (1,)), Block(2, (1,)))
    assert after[1] == (Block(1, (0,)), Block(1, (1,)), Block(1, (2,)))  # chunk 1 of everyone
    _, after = expected_blocks("ppermute", 3)
    assert after == {0: (Block(0, (2,)),), 1: (Block(0, (0,)),), 2: (Block(0, (1,)),)}
    _, after = expected_blocks("psum_scatter", 2)
    assert after == {0: (Block(0, (0, 1)),), 1: (Block(1, (0, 1)),)}
    with pytest.raises(ValueError, match="collective='reduce'"):
        expected_blocks("reduce", 2)


def test_blocks_by_device_reads_real_shards(mesh):
    x = jax.device_put(tag_blocks(N, 1), NamedSharding(mesh, P("x")))
    held = blocks_by_device(x)
    assert list(held) == list(range(N))
    assert held[5] == (Block(0, (5,)),)
    with pytest.raises(ValueError, match="placed jax.Array"):
        blocks_by_device(np.zeros((2, 2)))


@pytest.mark.parametrize("n", range(1, 9))
def test_ring_all_gather_rounds_pass_one_block_per_round_and_end_as_all_gather(n):
    rounds = ring_all_gather_rounds(n)
    assert len(rounds) == n  # before, then n-1 rounds
    assert rounds[0] == expected_blocks("all_gather", n)[0]
    assert rounds[-1] == expected_blocks("all_gather", n)[1]
    sent = 0
    for k in range(1, n):
        for d in range(n):
            arrived = set(rounds[k][d]) - set(rounds[k - 1][d])
            # one new block a round, from the device k places back round the ring ...
            assert arrived == {Block(0, ((d - k) % n,))}
            # ... which device d-1 held after the round before: it passed it on
            assert Block(0, ((d - k) % n,)) in rounds[k - 1][(d - 1) % n]
            sent += 1
    assert sent == n * (n - 1)  # n-1 blocks per device: ring_bytes's b·(n-1)
    assert ring_bytes("all_gather", 1.0, n) == n - 1


def test_ring_all_gather_rounds_rejects_a_bad_count():
    with pytest.raises(ValueError, match="n_devices=0 must be between"):
        ring_all_gather_rounds(0)


def test_ring_bytes_closed_forms():
    b = 800.0
    assert ring_bytes("psum", b, 8) == 2 * 800 * 7 / 8
    assert ring_bytes("all_gather", b, 8) == 800 * 7
    assert ring_bytes("psum_scatter", b, 8) == 800 * 7 / 8
    assert ring_bytes("ppermute", b, 8) == 800
    assert ring_bytes("all_to_all", b, 8) == 800 * 7 / 8
    assert all(ring_bytes(c, b, 1) == 0 for c in COLLECTIVES)  # one device: nothing moves
    # all-reduce = reduce-scatter of b + all-gather of b/n
    assert ring_bytes("psum", b, 5) == pytest.approx(
        ring_bytes("psum_scatter", b, 5) + ring_bytes("all_gather", b / 5, 5)
    )
    with pytest.raises(ValueError, match="block_bytes"):
        ring_bytes("psum", -1, 2)
    with pytest.raises(ValueError, match="n_devices=0"):
        ring_bytes("psum", 1, 0)


def test_gpipe_schedule_stage_tick_micro():
    s = gpipe_schedule(3, 2)
    assert s.tolist() == [[0, 1, -1, -1], [-1, 0, 1, -1], [-1, -1, 0, 1]]
    big = gpipe_schedule(4, 8)
    assert big.shape == (4, 11)
    assert big[2, 5] == 3  # micro-batch 3 reaches stage 2 at tick 3 + 2
    for stage in range(4):  # every stage sees every micro-batch once, in order
        assert [m for m in big[stage] if m >= 0] == list(range(8))
    assert bubble_fraction(s) == pytest.approx(6 / 12)
    for n_stages, n_micro in ((2, 1), (4, 8), (7, 14), (8, 32)):
        assert bubble_fraction(gpipe_schedule(n_stages, n_micro)) == pytest.approx(
            gpipe_bubble(n_stages, n_micro)
        )
    assert gpipe_bubble(1, 5) == 0.0
    with pytest.raises(ValueError, match="n_micro=0"):
        gpipe_schedule(2, 0)
    with pytest.raises(ValueError, match="2-D"):
        bubble_fraction(np.zeros(3))


def test_hlo_op_sequence_orders_dots_and_permutes(mesh):
    def ring_matmul(x, w):
        out = []
        for i in range(3):
            out.append(x @ w)
            if i < 2:
                x = jax.lax.ppermute(x, "x", [(d, (d + 1) % N) for d in range(N)])
        return sum(out)

    compiled = (
        jax.jit(jax.shard_map(ring_matmul, mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x")))
        .lower(np.ones((4 * N, 16), np.float32), np.ones((16, 8), np.float32))
        .compile()
    )
    seq = hlo_op_sequence(compiled)
    assert seq.count("dot") == 3 and seq.count("collective-permute") == 2
    assert seq.index("dot") < len(seq) - 1  # at least one dot before the last permute
    with pytest.raises(ValueError, match="compiled executable"):
        hlo_op_sequence("not HLO")


# XLA:TPU's form of one matmul (libtpu 0.0.42.1, trimmed): a convolution inside a fusion.
TPU_MATMUL_HLO = """HloModule jit_matmul, entry_computation_layout={(f32[4,32], f32[32,16])->f32[4,16]}

%fused_computation (param_0: f32[4,32], param_1: f32[32,16]) -> f32[4,16] {
  %param_0 = f32[4,32]{1,0:T(4,128)} parameter(0)
  %param_1 = f32[32,16]{0,1:T(8,128)} parameter(1)
  ROOT %convolution.1 = f32[4,16]{1,0:T(4,128)} convolution(%param_0, %param_1), dim_labels=bf_io->bf
}

ENTRY %main.4 (x_blk.1: f32[4,32], w_blk.1: f32[32,16]) -> f32[4,16] {
  %x_blk.1 = f32[4,32]{1,0:T(4,128)} parameter(0)
  %w_blk.1 = f32[32,16]{0,1:T(8,128)} parameter(1)
  %cp = f32[32,16]{0,1:T(8,128)} collective-permute(%w_blk.1), source_target_pairs={{0,1},{1,0}}
  %fusion = f32[4,16]{1,0:T(4,128)} fusion(%x_blk.1, %cp), kind=kOutput, calls=%fused_computation
  ROOT %convolution.2 = f32[4,16]{1,0:T(4,128)} convolution(%x_blk.1, %w_blk.1), dim_labels=bf_io->bf
}
"""


def test_hlo_op_sequence_counts_xla_tpus_convolution_as_a_matmul():
    assert hlo_op_sequence(TPU_MATMUL_HLO) == ["collective-permute", "dot", "dot"]
    assert hlo_op_sequence(TPU_MATMUL_HLO, include=()) == ["collective-permute"]
    assert hlo_op_sequence(TPU_MATMUL_HLO, include=("convolution",)).count("convolution") == 2


@pytest.mark.parametrize("bad", [3, None, ["HloModule"]])
def test_hlo_op_sequence_refuses_a_wrong_type_naming_the_parameter(bad):
    with pytest.raises(
        TypeError, match=r"hlo_op_sequence: compiled=.* expected a compiled executable"
    ):
        hlo_op_sequence(bad)
    with pytest.raises(TypeError, match=r"hlo_op_sequence: include='dot' is a string"):
        hlo_op_sequence("ENTRY", include="dot")


def test_compat_pvary_gives_each_device_its_own_gradient(mesh):
    from helpers.compat import pvary

    x = np.arange(N * 2 * 3, dtype=np.float32).reshape(N * 2, 3)
    w = np.ones(3, np.float32)

    def grads(mark):
        def f(w, block):
            w = pvary(w, "x") if mark else w
            return jax.grad(lambda w: (block @ w).sum())(w)[None]

        return np.asarray(
            jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P(), P("x")), out_specs=P("x")))(w, x)
        )

    np.testing.assert_allclose(grads(False)[3], x.sum(axis=0))  # shared w: summed for us
    np.testing.assert_allclose(grads(True)[3], x[6:8].sum(axis=0))  # device 3's two rows
