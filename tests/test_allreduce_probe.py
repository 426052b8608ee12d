"""helpers.cluster.allreduce_probe: the one-process-per-device all-reduce that notebook 07 runs with
and without XLA's NVSHMEM flag on GPUs. Here it runs on CPU (gloo, loopback only), which
checks everything but the GPU: the launch, the flags each process gets, the sum, the report."""

import jax

from helpers.cluster.allreduce_probe import (
    NVSHMEM_FLAG,
    Variant,
    backend_configs,
    count_gpus,
    launch_probe,
    xla_flag_accepted,
)


def test_xla_flag_accepted_tells_known_from_unknown():
    ok, why = xla_flag_accepted("--xla_this_flag_does_not_exist=true")
    assert not ok and why.startswith("Unknown flag in XLA_FLAGS")
    ok, why = xla_flag_accepted("--xla_backend_optimization_level=1")
    assert ok and why == ""


def test_two_processes_all_reduce_with_the_flag_in_their_environment():
    known, why = xla_flag_accepted(NVSHMEM_FLAG)
    # jaxlib 0.8 to 0.10 know the flag; jaxlib 0.12 removed it (asserted below, as notebook 07
    # says), and a process started with it stops at once.
    if jax.__version_info__ < (0, 11):
        assert known, why
    elif jax.__version_info__ >= (0, 12):
        assert not known, "jaxlib 0.12 removed the flag; this one accepts it"
    v = launch_probe(2, extra_flags=NVSHMEM_FLAG, platform="cpu", nbytes=4096, iters=3,
                     timeout_s=120)  # fmt: skip
    if not known:
        assert v.failure is not None and "Unknown flag in XLA_FLAGS" in v.failure
        return
    assert v.failure is None, v.failure
    assert sorted(r["process"] for r in v.results) == [0, 1]
    for r in v.results:
        assert r["devices"] == 2 and r["platform"] == "cpu"
        assert r["correct"] and r["nbytes_per_device"] == 4096
        assert NVSHMEM_FLAG in r["xla_flags"]  # what the process itself saw
        assert len(r["backend_configs"]) == 1  # one all-reduce in the compiled program
    assert "sum correct" in v.summary()


def test_backend_configs_from_hlo_text():
    text = (
        "%ar = f32[4]{0} all-reduce-start(%p), channel_id=1, replica_groups={{0,1}}, "
        'to_apply=%add, backend_config={"collective_backend_config":{"backend":"NVSHMEM"}}\n'
        "%x = f32[4]{0} all-reduce(%q), channel_id=2, to_apply=%add\n"
        "%y = f32[4]{0} add(%a, %b)\n"
    )
    assert backend_configs(text) == ['{"collective_backend_config":{"backend":"NVSHMEM"}}', "none"]


def test_a_failed_launch_says_why_and_no_gpu_means_zero():
    assert (
        Variant("x", "", failure="0 of 2 processes reported")
        .summary()
        .startswith("x: did not run (0 of 2")
    )
    assert isinstance(count_gpus(), int) and count_gpus() >= 0
