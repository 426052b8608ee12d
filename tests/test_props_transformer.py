"""Property-based tests of the Transformer in helpers.placing.models and the name reports of helpers.placing.sharding."""

from __future__ import annotations

import math
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.placing.models import TransformerConfig, padded_vocab_size, synthetic_tokens
from helpers.placing.sharding import (
    LOGICAL_RULES,
    UnmappedLogicalNameWarning,
    logical_names,
    param_order,
    path_str,
    unmapped_logical_names,
    warn_unmapped_logical_names,
)

configs = st.builds(
    TransformerConfig,
    vocab_size=st.sampled_from([17, 64, 101]),
    d_model=st.sampled_from([8, 16]),
    n_heads=st.sampled_from([1, 2]),
    head_dim=st.sampled_from([4, 8]),
    d_ff=st.sampled_from([8, 32]),
    n_layers=st.integers(1, 3),
    batch=st.just(2),
    seq=st.sampled_from([4, 8]),
    vocab_multiple=st.sampled_from([1, 8, 128]),
    scan_layers=st.booleans(),
)


def _abstract(cfg: TransformerConfig):
    tokens = jnp.zeros((1, cfg.seq), jnp.int32)
    return jax.eval_shape(cfg.model().init, jax.random.key(0), tokens), tokens


@given(st.integers(1, 10**6), st.integers(1, 4096))
def test_padded_vocab_is_the_next_multiple(v, m):
    p = padded_vocab_size(v, m)
    assert p % m == 0 and v <= p < v + m


@settings(max_examples=12)
@given(configs)
def test_param_count_matches_init_and_every_name_has_a_rule_in_every_preset(cfg):
    abstract, tokens = _abstract(cfg)
    params = nn.meta.unbox(abstract)["params"]
    assert sum(math.prod(p.shape) for p in jax.tree.leaves(params)) == cfg.param_count()
    names = logical_names(abstract)
    assert {"embed", "vocab", "heads", "kv", "mlp"} <= set(names)
    for preset in LOGICAL_RULES:
        assert unmapped_logical_names(abstract, preset) == {}
    # Model order lists every parameter once, embedding first and the logits last.
    order = param_order(cfg.model(), tokens)
    paths = [path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    assert sorted(order) == sorted(paths) and len(set(order)) == len(order)
    assert "embed" in order[0] and "lm_head" in order[-1]


@settings(max_examples=12)
@given(configs)
def test_flops_are_six_per_matmul_parameter_plus_attention(cfg):
    tokens = cfg.batch * cfg.seq
    attention = 12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * cfg.seq * tokens
    assert cfg.train_flops_per_step() == 6 * cfg.matmul_params() * tokens + attention
    assert cfg.matmul_params() < cfg.param_count()  # the table and the norms are not matmuls


@settings(max_examples=6)
@given(configs, st.integers(0, 1000))
def test_synthetic_tokens_are_in_the_vocabulary(cfg, seed):
    x, y = synthetic_tokens(jax.random.key(seed), cfg)
    assert x.shape == (cfg.batch, cfg.seq) and y.shape == (cfg.batch, cfg.seq)
    assert int(x.min()) >= 0 and int(max(x.max(), y.max())) < cfg.vocab_size
    assert (x[:, 1:] == y[:, :-1]).all()  # the labels are the next tokens


@settings(max_examples=12)
@given(
    configs,
    st.sets(st.sampled_from(["embed", "vocab", "heads", "kv", "mlp", "length"]), min_size=1),
)
def test_names_without_a_rule_are_reported_and_warned_about(cfg, dropped):
    abstract, _ = _abstract(cfg)
    rules = tuple((n, a) for n, a in LOGICAL_RULES["fsdp_tp"] if n not in dropped)
    used = set(logical_names(abstract))
    missing = unmapped_logical_names(abstract, rules)
    assert set(missing) == dropped & used
    for users in missing.values():
        params = {
            path_str(p)
            for p, _ in jax.tree_util.tree_flatten_with_path(nn.meta.unbox(abstract)["params"])[0]
        }
        assert users and all(u.removeprefix("params/") in params for u in users)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_unmapped_logical_names(abstract, rules)
    warned = [w for w in caught if issubclass(w.category, UnmappedLogicalNameWarning)]
    assert bool(warned) == bool(missing)
    if warned:
        assert all(repr(n) in str(warned[0].message) for n in missing)


@given(
    st.one_of(st.integers(), st.text(max_size=4), st.lists(st.integers(), min_size=1, max_size=2))
)
def test_rules_that_are_not_rules_are_refused(rules):
    abstract = {"w": nn.LogicallyPartitioned(jnp.zeros((2, 2)), names=("embed", "mlp"))}
    if isinstance(rules, str) and rules in LOGICAL_RULES:
        return
    with pytest.raises(ValueError):
        unmapped_logical_names(abstract, rules)
