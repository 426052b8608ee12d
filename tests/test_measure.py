import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from helpers import (
    collective_line,
    collective_ops,
    collective_stats,
    format_collectives,
    live_memory,
    make_mesh,
    memory_per_device,
    planned_bytes_per_device,
    shard_tree,
    sharding_table,
    step_memory,
)


@pytest.fixture(scope="module")
def mesh():
    return make_mesh((8,), ("data",))


def test_memory_per_device_sharded_and_replicated(mesh):
    tree = shard_tree(
        {"w": jnp.ones((64, 32)), "b": jnp.ones((32,))}, {"w": P("data"), "b": P()}, mesh
    )
    mem = memory_per_device(tree)
    assert list(mem) == [f"cpu:{i}" for i in range(8)]
    assert set(mem.values()) == {64 * 32 * 4 // 8 + 32 * 4}
    assert planned_bytes_per_device(tree) == mem


def test_planned_bytes_for_abstract_tree(mesh):
    abstract = {
        "w": jax.ShapeDtypeStruct((16, 4), jnp.bfloat16, sharding=NamedSharding(mesh, P("data")))
    }
    assert planned_bytes_per_device(abstract) == {f"cpu:{i}": 2 * 4 * 2 for i in range(8)}
    with pytest.raises(ValueError, match="not a placed jax.Array"):
        memory_per_device(abstract)


def test_sharding_table_rows_and_totals(mesh):
    tree = shard_tree(
        {"w": jnp.ones((64, 32)), "b": jnp.ones((32,))}, {"w": P("data"), "b": P()}, mesh
    )
    table = sharding_table(tree)
    lines = table.splitlines()
    assert lines[0].split() == [
        "parameter",
        "shape",
        "dtype",
        "spec",
        "shard",
        "shape",
        "bytes/device",
    ]
    row_w = next(line for line in lines if line.startswith("w "))
    assert (
        "(64, 32)" in row_w and "('data',)" in row_w and "(8, 32)" in row_w and "1.0 KiB" in row_w
    )
    row_b = next(line for line in lines if line.startswith("b "))
    assert "()" in row_b and "128 B" in row_b
    assert "total: 8.1 KiB in 2 arrays" in table
    assert "largest per-device share: 1.1 KiB on 8 device(s)" in table


def test_table_rejects_non_array(mesh):
    with pytest.raises(ValueError, match="parameter 'n'"):
        sharding_table({"n": 3})


def _grad_step(mesh, w_spec):
    s = lambda *spec: NamedSharding(mesh, P(*spec))  # noqa: E731

    def loss(w, x):
        return ((x @ w) ** 2).mean()

    f = jax.jit(jax.grad(loss), in_shardings=(s(*w_spec), s("data")), out_shardings=s(*w_spec))
    w = jax.ShapeDtypeStruct((64, 128), jnp.float32)
    x = jax.ShapeDtypeStruct((32, 64), jnp.float32)
    return f.lower(w, x).compile()


def test_collectives_of_data_parallel_gradient(mesh):
    stats = collective_stats(_grad_step(mesh, ()))
    assert set(stats) == {"all-reduce"}
    ar = stats["all-reduce"]
    grad_bytes = 64 * 128 * 4
    assert ar["ops"] == 1 and ar["bytes"] == grad_bytes
    assert ar["sent_per_device"] == pytest.approx(2 * grad_bytes * 7 / 8)


def test_collectives_of_fsdp_gradient(mesh):
    stats = collective_stats(_grad_step(mesh, ("data",)))
    assert stats["all-gather"]["bytes"] == 64 * 128 * 4  # the full weight is gathered
    assert stats["all-gather"]["sent_per_device"] == pytest.approx(64 * 128 * 4 * 7 / 8)
    # the CPU backend reduces the gradient with an all-reduce (GPU builds form reduce-scatter)
    assert "all-reduce" in stats or "reduce-scatter" in stats


def test_no_collectives_without_sharding(mesh):
    compiled = jax.jit(lambda x: x * 2).lower(jnp.ones(4)).compile()
    assert collective_stats(compiled) == {}
    assert format_collectives({}).startswith("no collectives")


HLO_ASYNC = """
HloModule m, num_partitions=8
ENTRY %main {
  %p = f32[16,128]{1,0} parameter(0)
  %ags = (f32[16,128]{1,0}, f32[128,128]{1,0}) all-gather-start(%p), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}
  %agd = f32[128,128]{1,0} all-gather-done(%ags)
  %ar = (f32[10]{0}, bf16[20]{0}) all-reduce(%a, %b), channel_id=2, replica_groups={{0,1},{2,3},{4,5},{6,7}}, to_apply=%add
  %rs = f32[4]{0} reduce-scatter(%c), channel_id=3, replica_groups=[2,4]<=[8], dimensions={0}, to_apply=%add
  %cp = f32[8]{0} collective-permute(%d), channel_id=4, source_target_pairs={{0,1},{1,0}}
}
"""


def test_collectives_from_text_async_tuple_and_groups():
    stats = collective_stats(HLO_ASYNC)
    ag = stats["all-gather"]
    assert ag["ops"] == 1 and ag["operands"] == 1  # start/done counted once
    assert ag["bytes"] == 128 * 128 * 4
    assert ag["sent_per_device"] == pytest.approx(128 * 128 * 4 * 7 / 8)
    ar = stats["all-reduce"]
    assert ar["ops"] == 1 and ar["operands"] == 2  # combined op counts both operands
    assert ar["bytes"] == 40 + 40
    assert ar["sent_per_device"] == pytest.approx(2 * 80 * 1 / 2)  # groups of 2
    rs = stats["reduce-scatter"]
    assert rs["bytes"] == 16 * 4  # full input = shard x group size 4
    assert rs["sent_per_device"] == pytest.approx(64 * 3 / 4)
    assert stats["collective-permute"]["sent_per_device"] == 32


HLO_LINES = """
HloModule m, num_partitions=8
ENTRY %main {
  %a2a = (f32[1,4]{1,0}, f32[1,4]{1,0}, f32[1,4]{1,0}, f32[1,4]{1,0}, /*index=4*/f32[1,4]{1,0}) all-to-all(%s0, %s1, %s2, %s3, /*index=4*/%s4), channel_id=1, replica_groups={{0,1,2,3,4}}, metadata={op_name="jit(f)/all_to_all"}
  %ar.1 = f32[8]{0} all-reduce(%x), channel_id=2, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add, metadata={op_name="a"}
  %ar.2 = (f32[2,8]{1,0}, f32[2,8]{1,0}) all-reduce(%y, %z), channel_id=3, replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add
  %cps = (f32[8]{0}, f32[8]{0}) collective-permute-start(%d), channel_id=4, source_target_pairs={{0,1},{1,0}}, backend_config={"x":1}
}
"""


def test_collective_line_shortens_the_first_matching_instruction():
    assert collective_line(HLO_LINES, "all-to-all") == (
        "%a2a = (f32[1,4], f32[1,4], …, 5 in all) all-to-all(%s0, %s1, …, 5 in all), "
        "replica_groups={{0,1,2,3,4}}"
    )
    assert collective_line(HLO_LINES, "all-reduce") == (
        "%ar.1 = f32[8] all-reduce(%x), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add"
    )
    assert collective_line(HLO_LINES, "all-reduce", containing="f32[2,8]").startswith(
        "%ar.2 = (f32[2,8], f32[2,8]) all-reduce(%y, %z), "
    )
    assert collective_line(HLO_LINES, "collective-permute") == (
        "%cps = (f32[8], f32[8]) collective-permute-start(%d), source_target_pairs={{0,1},{1,0}}"
    )
    with pytest.raises(ValueError, match="no all-gather"):
        collective_line(HLO_LINES, "all-gather")
    with pytest.raises(ValueError, match="whose line contains 'f64'"):
        collective_line(HLO_LINES, "all-reduce", containing="f64")
    with pytest.raises(ValueError, match="kind='psum' must be one of"):
        collective_line(HLO_LINES, "psum")


def test_collective_line_of_a_compiled_psum(mesh):
    f = jax.shard_map(
        lambda a: jax.lax.psum(a, "data"), mesh=mesh, in_specs=P("data"), out_specs=P()
    )
    line = collective_line(jax.jit(f).lower(jnp.ones((8, 3))).compile(), "all-reduce")
    assert " all-reduce(" in line and "f32[1,3]" in line and "metadata" not in line


def test_step_memory_fields(mesh):
    mem = step_memory(_grad_step(mesh, ("data",)))
    assert mem["argument"] == (64 * 128 * 4) // 8 + (32 * 64 * 4) // 8
    assert mem["output"] == (64 * 128 * 4) // 8
    assert mem["total"] == mem["argument"] + mem["output"] + mem["temp"] - mem["alias"]


def test_collective_permute_to_itself_moves_nothing():
    text = HLO_ASYNC.replace("source_target_pairs={{0,1},{1,0}}", "source_target_pairs={{0,0}}")
    cp = collective_stats(text)["collective-permute"]
    assert cp["ops"] == 1 and cp["bytes"] == 32  # the op is there ...
    assert cp["sent_per_device"] == 0  # ... but nothing leaves the device
    # A ppermute over a one-device axis compiles to exactly that.
    one = make_mesh((1,), ("x",))
    f = jax.shard_map(lambda b: jax.lax.ppermute(b, "x", [(0, 0)]), mesh=one, in_specs=P("x"),
                      out_specs=P("x"))  # fmt: skip
    stats = collective_stats(jax.jit(f).lower(jnp.ones((4, 2))).compile())
    assert stats.get("collective-permute", {"sent_per_device": 0})["sent_per_device"] == 0
    # Eight devices in a ring: each sends its 4 x 2 float32 block once.
    ring = jax.shard_map(
        lambda b: jax.lax.ppermute(b, "data", [(d, (d + 1) % 8) for d in range(8)]),
        mesh=make_mesh((8,), ("data",)), in_specs=P("data"), out_specs=P("data"),
    )  # fmt: skip
    stats = collective_stats(jax.jit(ring).lower(jnp.ones((32, 2))).compile())
    assert stats["collective-permute"]["sent_per_device"] == 4 * 2 * 4


HLO_LOOP = """
HloModule m, num_partitions=4

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]{0}) parameter(0)
  %x = f32[8]{0} get-tuple-element(%p), index=1
  %m = f32[8]{0} multiply(%x, %x), metadata={op_name="jit(step)/while/body/block/mlp/down/dot_general"}
  %ar = f32[8]{0} all-reduce(%m), channel_id=1, replica_groups=[1,4]<=[4], to_apply=%add, metadata={op_name="jit(step)/while/body/ar"}
  ROOT %t = (s32[], f32[8]{0}) tuple(%i, %ar)
}

ENTRY %main (a: f32[8]) -> f32[32] {
  %a = f32[8]{0} parameter(0), metadata={op_name="jit(step)/lm_head/kernel"}
  %w = (s32[], f32[8]{0}) while(%t0), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"5"}}
  ROOT %g = f32[32]{0} all-gather(%a), channel_id=2, replica_groups=[1,4]<=[4], dimensions={0}, metadata={op_name="jit(step)/gather"}
}
"""


def test_collective_ops_know_their_loop_and_their_source():
    ar, ag = collective_ops(HLO_LOOP)
    assert (ar.kind, ar.arrays, ar.group, ar.runs) == ("all-reduce", (("f32", (8,)),), 4, 5)
    assert ar.sources == ("jit(step)/while/body/block/mlp/down/dot_general",)  # what went in
    assert ar.bytes == 32 and ar.sent_per_device == pytest.approx(2 * 32 * 3 / 4)
    assert (ag.kind, ag.bytes, ag.runs) == ("all-gather", 128, 1)
    assert ag.sources == ("jit(step)/lm_head/kernel",)
    as_written = collective_stats(HLO_LOOP)
    per_step = collective_stats(HLO_LOOP, per_step=True)
    assert as_written["all-reduce"]["ops"] == 1 and per_step["all-reduce"]["ops"] == 5
    assert per_step["all-reduce"]["sent_per_device"] == pytest.approx(5 * 48)
    assert per_step["all-gather"] == as_written["all-gather"]


def test_collective_ops_of_a_combined_all_reduce_name_each_operand():
    (ag, ar, rs, cp) = collective_ops(HLO_ASYNC)
    assert ag.kind == "all-gather" and ag.arrays == (("f32", (128, 128)),)
    assert ar.arrays == (("f32", (10,)), ("bf16", (20,))) and ar.group == 2
    assert rs.arrays == (("f32", (16,)),)  # the full input: a shard of 4 x a group of 4
    assert cp.sent_per_device == 32


def test_collective_ops_count_a_scanned_gather_once_per_layer(mesh):
    """A weight stack split over 'data', scanned layer by layer: each layer's slice is
    gathered inside the loop body, so the gather runs once per layer."""
    layers = 3

    def f(ws, x):
        def body(h, w):
            return jnp.tanh(h @ w), None

        return jax.lax.scan(body, x, ws)[0].sum()

    s = lambda *spec: NamedSharding(mesh, P(*spec))  # noqa: E731
    ws = jax.ShapeDtypeStruct((layers, 64, 64), jnp.float32)
    x = jax.ShapeDtypeStruct((16, 64), jnp.float32)
    compiled = jax.jit(f, in_shardings=(s(None, "data"), s())).lower(ws, x).compile()
    looped = [c for c in collective_ops(compiled) if c.runs > 1]
    assert looped and all(c.runs == layers for c in looped)
    per_step = collective_stats(compiled, per_step=True)
    as_written = collective_stats(compiled)
    kind = looped[0].kind
    assert per_step[kind]["ops"] > as_written[kind]["ops"]


HLO_LIVE = """HloModule m, is_scheduled=true, num_partitions=2
ENTRY %main (p0: f32[4,8]) -> f32[8,8] {
  %p0 = f32[4,8]{1,0} parameter(0)
  %ag = f32[8,8]{1,0} all-gather(%p0), replica_groups={{0,1}}, dimensions={0}
  %a = f32[8,8]{1,0} add(%ag, %ag), metadata={op_name="jit(f)/jvp(M)/add"}
  %b = f32[8,8]{1,0} multiply(%a, %ag), metadata={op_name="jit(f)/transpose(jvp(M))/mul"}
  %v = f32[2,32]{1,0} bitcast(%b)
  ROOT %c = f32[8,8]{1,0} negate(%b)
}
"""


def test_live_memory_replays_the_schedule():
    """Each buffer lives from its instruction to its last use; a view adds nothing; the
    step's output is no temporary. The backward-pass array with a parameter's shape is a
    gradient."""
    live = live_memory(HLO_LIVE)
    assert live.temp is None
    assert live.totals == [0, 256, 512, 768, 256, 256]
    assert live.phases[2:4] == ("forward", "backward")
    assert live.peak == 768
    assert live.at_peak == {
        "gathered parameters": 256, "gradients": 256, "activations": 256, "other": 0,
    }  # fmt: skip
    assert live.most["gathered parameters"] == 256


def test_live_memory_itemises_the_peak():
    """largest_at_peak lists the buffers alive at the peak, largest first, each with its
    kind, shape and HLO op; together they are the peak, kind by kind."""
    live = live_memory(HLO_LIVE)
    alive = live.largest_at_peak(None)
    assert sum(b.nbytes for b in alive) == live.peak
    assert sorted((b.kind, b.op) for b in alive) == [
        ("activations", "add"), ("gathered parameters", "all-gather"), ("gradients", "multiply"),
    ]  # fmt: skip
    assert all(b.dtype == "f32" and b.shape == (8, 8) for b in alive)
    assert {b.op_name for b in alive if b.op == "add"} == {"jit(f)/jvp(M)/add"}
    assert len(live.largest_at_peak(2)) == 2 and live.largest_at_peak() == alive
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="n must be None or a positive integer"):
            live.largest_at_peak(bad)


def test_live_memory_lists_any_step():
    """alive_at lists the buffers alive after any step, summing to that step's total; a
    step outside the schedule is a clear error."""
    live = live_memory(HLO_LIVE)
    for t, total in enumerate(live.totals):
        assert sum(b.nbytes for b in live.alive_at(t)) == total
    assert [b.kind for b in live.alive_at(1)] == [next(k for k, v in live.steps[1].items() if v)]
    for bad in (-1, len(live.steps), 1.0, True, "2"):
        with pytest.raises(ValueError, match="step must be an index of steps"):
            live.alive_at(bad)


def _mlp_step(mesh, **changes):
    import dataclasses

    import flax.linen as nn
    import optax

    from helpers import (
        ModelConfig,
        ShardedState,
        make_train_step,
        opt_state_shardings,
        param_shardings,
        synthetic_batch,
    )

    strategy = changes.pop("strategy", "fsdp")
    cfg = dataclasses.replace(
        ModelConfig(d_model=64, d_ff=256, n_layers=4, n_classes=8, batch=16, seq=4), **changes
    )
    model, tx = cfg.model(), optax.adam(1e-3)
    x, y = synthetic_batch(jax.random.key(0), cfg)
    sh = param_shardings(model, x, mesh, strategy)
    shapes = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), x))["params"]
    p = jax.tree.map(lambda s, h: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=h), shapes, sh)
    osh = opt_state_shardings(tx, p, sh, mesh)
    o = jax.tree.map(
        lambda s, h: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=h),
        jax.eval_shape(tx.init, p),
        osh,
    )
    step = make_train_step(model, tx, mesh, ShardedState(p, o, sh, osh), strategy)
    return step.lower(p, o, x, y).compile()


@pytest.fixture(scope="module")
def mesh2d():
    return make_mesh((8, 1), ("data", "model"))


def test_live_memory_of_fsdp_kept_and_freed(mesh2d):
    """The plain FSDP step holds every gathered kernel at once; scanned and rematerialised,
    one layer's at a time. The replay's peak is XLA's temp, within 2%."""
    kernel = 64 * 256 * 4  # one block kernel, gathered
    kept, freed = _mlp_step(mesh2d), _mlp_step(mesh2d, scan_layers=True, remat=True)
    for compiled in (kept, freed):
        live = live_memory(compiled)
        assert live.temp == step_memory(compiled)["temp"]
        assert abs(live.peak - live.temp) <= 0.02 * live.temp
        assert all(sum(s.values()) == t for s, t in zip(live.steps, live.totals, strict=True))
        alive = live.largest_at_peak(None)  # a loop body's buffers too, for the scanned step
        assert sum(b.nbytes for b in alive) == live.peak
        for kind, total in live.at_peak.items():
            assert sum(b.nbytes for b in alive if b.kind == kind) == total
    kept_live, freed_live = live_memory(kept), live_memory(freed)
    assert kept_live.most["gathered parameters"] >= 8 * kernel  # 4 blocks x 2 kernels at once
    assert 2 * kernel <= freed_live.most["gathered parameters"] < 4 * kernel  # one block's
    assert freed_live.peak < kept_live.peak


def test_live_memory_of_data_parallel_gathers_nothing(mesh2d):
    live = live_memory(_mlp_step(mesh2d, strategy="dp"))
    assert live.most["gathered parameters"] == 0 and live.most["gradients"] > 0


def test_live_memory_wants_a_compiled_step():
    with pytest.raises(TypeError, match="live_memory|collective_stats"):
        live_memory(jax.jit(lambda a: a + 1))
    with pytest.raises(ValueError, match="HloModule"):
        live_memory("module @x {}")


def test_shard_map_collectives_sharing_channel_one_are_each_counted():
    """XLA:CPU gives every shard_map collective channel_id=1; each is a collective of its own
    (only copies inside fused computations, XLA:TPU's, are merged by channel_id)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from helpers import collective_ops, make_mesh

    mesh = make_mesh((len(jax.devices()),), ("d",))

    def two_gathers(x):
        a = jax.lax.all_gather(x, "d", tiled=True)
        return a + jax.lax.all_gather(x * 2, "d", tiled=True).sum()

    f = jax.jit(jax.shard_map(two_gathers, mesh=mesh, in_specs=P("d"), out_specs=P("d")))
    x = jax.device_put(jnp.ones((8 * len(jax.devices()),)), NamedSharding(mesh, P("d")))
    ops = [o for o in collective_ops(f.lower(x).compile()) if o.kind == "all-gather"]
    assert len(jax.devices()) == 1 or len(ops) == 2
