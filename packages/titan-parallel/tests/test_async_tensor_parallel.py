"""Async tensor parallel: the chunked ops and styles on 2 ranks (async_tp_script.py; with them Linear
subclasses that offer their own matmuls or decline), the plan rewrite, and where torch's SymmetricMemory
path can run."""

import logging
import sys
from pathlib import Path

import pytest
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

sys.path.insert(0, str(Path(__file__).resolve().parent))  # multiprocess.py beside the tests (importlib mode)

from multiprocess import launch  # noqa: E402

from titan_parallel import (  # noqa: E402
    AsyncColwiseParallel,
    AsyncRowwiseParallel,
    async_tp_plan,
    symmetric_memory_unavailable,
)
from titan_parallel.tp.async_tp_ops import chunk_bounds  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "async_tp_script.py"
CASES = [
    *(f"all_gather_matmul_chunks{c}" for c in (1, 2, 3, 5)),
    *(f"matmul_reduce_scatter_chunks{c}" for c in (1, 2, 3, 5)),
    "bad_chunks",
    "overlap",
    "styles",
    "offered_matmuls",
    "declined_matmuls",
]


def test_chunked_ops_match_unchunked_overlap_and_styles_match_plain_tp():
    output = launch(SCRIPT, 2)
    for rank in range(2):
        for case in CASES:
            assert f"rank {rank} {case} ok" in output, output[-6000:]


def test_chunk_bounds_split_unevenly_or_refuse():
    assert chunk_bounds(5, 3) == [(0, 2), (2, 2), (4, 1)]
    with pytest.raises(ValueError, match="chunks=6; use 1 to 5"):
        chunk_bounds(5, 6)


def test_plan_rewrite_touches_only_sequence_parallel_projections():
    plan = {
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        "layers.*.attention": PrepareModuleInput(
            input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
        ),
        "layers.*.attention.wq": ColwiseParallel(),
        "layers.*.attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "layers.*.other": ColwiseParallel(),  # its parent does not gather the sequence: left plain
        "layers.*.attention.wr": RowwiseParallel(),  # output Replicate: an all-reduce, left plain
    }
    rewritten = async_tp_plan(plan)
    assert type(rewritten["layers.*.attention.wq"]) is AsyncColwiseParallel
    assert type(rewritten["layers.*.attention.wo"]) is AsyncRowwiseParallel
    assert rewritten["layers.*.attention"].desired_input_layouts == (Shard(1), None)
    assert plan["layers.*.attention"].desired_input_layouts == (Replicate(), None)  # not mutated
    for fqn in ("output", "layers.*.other", "layers.*.attention.wr"):
        assert rewritten[fqn] is plan[fqn]


class OwnColwiseParallel(ColwiseParallel):
    """A style with logic of its own (as torchao's Float8ColwiseParallel casts before its collective)."""


def test_plan_rewrite_keeps_and_logs_styles_of_their_own(caplog):
    model = nn.Module()
    model.attention = nn.Module()
    model.attention.wq = nn.Linear(4, 4)
    plan = {
        "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "attention.wq": OwnColwiseParallel(),
    }
    with caplog.at_level(logging.INFO, logger="titan.parallel"):
        rewritten = async_tp_plan(plan, model=model)
    assert rewritten["attention.wq"] is plan["attention.wq"]
    assert "attention.wq (OwnColwiseParallel)" in caplog.text, caplog.text


@pytest.mark.parametrize(
    "device, backend, tp, gpus, reason",
    [
        ("cpu", "inductor", 2, 0, "needs CUDA"),
        ("cuda", None, 2, 8, "inductor backend"),
        ("cuda", "aot_eager", 2, 8, "inductor backend"),
        ("cuda", "inductor", 16, 8, "one node (8 GPUs"),
        ("cuda", "inductor", 8, 8, None),
    ],
)
def test_symmetric_memory_runs_only_on_cuda_compiled_within_a_node(device, backend, tp, gpus, reason):
    found = symmetric_memory_unavailable(device, backend, tp, gpus)
    assert found is None if reason is None else reason in found


def test_symmetric_memory_keeps_the_plain_styles_and_switches_on_the_inductor_pass(one_rank_mesh):
    import torch._inductor.config as inductor_config
    from torch import nn

    from titan_parallel import apply_tp, describe_applied

    # The config module's own patch: pytest's monkeypatch undoes a module attribute it did not find in the
    # module's __dict__ by deleting it, which hides an inductor setting from every later compile.
    with inductor_config.patch(_micro_pipeline_tp=False):
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        apply_tp(model, one_rank_mesh, {"0": ColwiseParallel(), "1": RowwiseParallel()}, async_tp="symmetric_memory")
        assert inductor_config._micro_pipeline_tp
    assert describe_applied([model], [])[0]["tp_styles"] == {"0": "ColwiseParallel", "1": "RowwiseParallel"}
    with pytest.raises(ValueError, match="async_tp='nccl'; use None, 'titan' or 'symmetric_memory'"):
        apply_tp(nn.Sequential(nn.Linear(4, 4)), one_rank_mesh, {"0": ColwiseParallel()}, async_tp="nccl")
