"""SimpleFSDP: argument checks in one process; parity, memory and checkpoints in launches of
simple_fsdp_script.py (2 and 4 ranks, gloo), each case against the plain toy model on the same global batch:
losses rtol 1e-5, every parameter's full gradient rtol 1e-4 / atol 1e-6, fp32 (mixed precision: see the
script). The inductor cases (compile time) are marked slow."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # multiprocess.py beside the tests (importlib mode)

from multiprocess import launch  # noqa: E402

from titan_parallel import OVERLAP_MODES, SIMPLE_FSDP_MODES, apply_ac, apply_compile, apply_simple_fsdp, enable_overlap

SCRIPT = Path(__file__).with_name("simple_fsdp_script.py")


def test_modes():
    assert SIMPLE_FSDP_MODES == ("fully_shard", "replicate", "hybrid_shard")
    with pytest.raises(ValueError, match="mode='zero3' is not supported; use one of fully_shard, replicate"):
        apply_simple_fsdp(None, None, "zero3")


def test_refuses_compiled_full_ac(build_toy_model, block_fqns):
    model = build_toy_model(n_layers=2)
    apply_ac(model, block_fqns(model), "full")
    apply_compile(model, block_fqns(model), backend="aot_eager")  # compiles at the first call, not here
    one_dim_mesh = SimpleNamespace(ndim=1)  # the check comes before the mesh is used
    with pytest.raises(ValueError, match=r"block 'layers.0' is compiled and checkpointed without a selective policy"):
        apply_simple_fsdp(model, one_dim_mesh, block_fqns=block_fqns(model))


def test_overlap_none_sets_nothing():
    assert "none" in OVERLAP_MODES
    assert enable_overlap("none", "aot_eager", "cpu") == {}


@pytest.mark.parametrize("mode", ["bucket", "bucket_reorder", "auto", "manual"])
def test_overlap_needs_inductor(mode):
    with pytest.raises(ValueError, match=rf"mode='{mode}' runs as inductor passes, but compile.backend='aot_eager'"):
        enable_overlap(mode, "aot_eager", "cpu")


@pytest.mark.parametrize("mode", ["auto", "manual"])
def test_overlap_scheduler_needs_a_gpu(mode):
    with pytest.raises(RuntimeError, match=rf"mode='{mode}' needs a CUDA GPU with triton.*No module named 'triton'"):
        enable_overlap(mode, "inductor", "cpu", manual_buckets=["attention"])


def test_overlap_unknown_mode():
    with pytest.raises(ValueError, match="mode='fast' is not supported; use one of none, bucket, bucket_reorder"):
        enable_overlap("fast")


def _launch(nproc: int, *args: str) -> str:
    return launch(SCRIPT, nproc, *args)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> str:
    return _launch(2, "two", str(tmp_path_factory.mktemp("simple_fsdp_dcp")))


@pytest.fixture(scope="module")
def four_ranks() -> str:
    return _launch(4, "four")


TWO = [
    "fully_shard2",
    "fully_shard2_compiled",
    "replicate2",
    "replicate2_compiled",
    "no_recompute2",
    "full_ac2",
    "op_ac2_compiled",
    "mixed_precision2",
    "memory_eager",
    "memory_compiled",
    "state_dict_dcp2",
]
FOUR = [
    "fully_shard4",
    "fully_shard4_compiled",
    "hybrid2x2",
    "hybrid2x2_compiled",
    "fully_shard2_tp2",
    "fully_shard2_tp2_compiled",
    "state_dict_hybrid2x2",
    "state_dict_tp2",
]


def _check(output: str, case: str, ranks: int) -> None:
    for rank in range(ranks):
        assert f"rank {rank} {case} ok" in output, output[-6000:]


@pytest.mark.parametrize("case", TWO)
def test_two_ranks(two_ranks, case):
    _check(two_ranks, case, 2)


@pytest.mark.parametrize("case", FOUR)
def test_four_ranks(four_ranks, case):
    _check(four_ranks, case, 4)


@pytest.mark.slow
def test_inductor_and_bucketing():
    output = _launch(2, "inductor")
    for case in ("inductor_none", "inductor_bucket", "inductor_bucket_reorder"):
        _check(output, case, 2)
