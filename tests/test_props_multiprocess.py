"""Property-based tests of helpers.cluster.multiprocess: which rows a process loads, addresses, sizes."""

from __future__ import annotations

import jax
import pytest
from generators import meshes
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from helpers.cluster import multiprocess


@settings(max_examples=30)
@given(meshes(max_axes=2), st.integers(1, 6))
def test_one_process_loads_every_row(mesh, rows_per_device):
    # In one process every device is addressable, so the process loads the whole batch.
    n = mesh.shape[mesh.axis_names[0]]
    shape = (n * rows_per_device, 3)
    rows = multiprocess.process_rows(NamedSharding(mesh, P(mesh.axis_names[0])), shape)
    assert rows == [slice(0, shape[0])]


@given(
    st.sampled_from(["127.0.0.1", "localhost", "[::1]", "10.0.0.1", "node-3", "::"]),
    st.integers(1, 65535),
)
def test_only_this_machine_is_loopback(host, port):
    assert multiprocess.is_loopback(f"{host}:{port}") == (
        host in ("127.0.0.1", "localhost", "[::1]")
    )
    assert multiprocess.is_loopback(None) is False


@given(st.integers(1, 64))
def test_fits_is_exactly_divisibility_of_the_batch_and_width(n):
    assert multiprocess.fits(n) == (
        multiprocess.GLOBAL_BATCH % n == 0 and multiprocess.D_MODEL % n == 0
    )


@given(st.lists(st.sampled_from(["--steps", "3", "--seed", "1", "--log-every", "2"]), max_size=0))
def test_the_script_parses_its_defaults(argv):
    args = multiprocess.parse_args(argv)
    assert args.steps >= 1 and args.log_every >= 1


def test_the_global_mesh_refuses_a_count_that_does_not_fit():
    if multiprocess.fits(len(jax.devices())):
        assert multiprocess.global_mesh("fsdp").size == len(jax.devices())
    else:  # pragma: no cover - 8 simulated devices fit
        with pytest.raises(SystemExit):
            multiprocess.global_mesh("fsdp")
