"""Tensor parallelism of Qwen3-Next's own tensors: a Qwen3-Next-shaped toy decoder (a Gated DeltaNet layer, a
gated-attention layer, experts with a gated shared expert) against the one-rank model on 2 gloo ranks
(qwen3_next_tp_script.py); and ChannelParallel's channels in blocks on one rank."""

import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts beside the tests (importlib mode)

from multiprocess import launch  # noqa: E402
from qwen3_next_tp_script import Declared  # noqa: E402

from titan_parallel import apply_tp  # noqa: E402

SCRIPT = Path(__file__).with_name("qwen3_next_tp_script.py")


def test_loss_and_every_gradient_equal_the_one_rank_model():
    output = launch(SCRIPT, 2)
    missing = [f"rank {r} matches_one_rank" for r in range(2) if f"rank {r} matches_one_rank ok" not in output]
    assert not missing, f"not ok: {missing}\n{output[-6000:]}"


def test_channels_in_blocks_are_stored_whole_and_read_as_this_ranks_part_of_each(one_rank_mesh):
    conv = nn.Conv1d(10, 10, 3, groups=10, bias=False)
    model = nn.ModuleDict({"conv": conv})
    apply_tp(model, one_rank_mesh, {"conv": Declared("channel_shard", sharded=("weight",), blocks=(4, 4, 2))})
    stored = conv._parameters["weight"]
    assert isinstance(stored, DTensor) and stored.placements == (Replicate(),)
    assert type(conv.weight) is torch.Tensor and conv.weight.shape == (10, 1, 3)  # one rank: every block whole
    conv.weight.sum().backward()
    assert stored.grad.placements in ((Partial(),), (Replicate(),))


def test_blocks_that_do_not_add_up_are_refused(one_rank_mesh):
    entry = Declared("channel_shard", sharded=("weight",), blocks=(4, 4))
    with pytest.raises(ValueError, match=r"Conv1d.weight has 10 channels, which blocks \(4, 4\) must add up to"):
        apply_tp(nn.ModuleDict({"conv": nn.Conv1d(10, 10, 3, groups=10, bias=False)}), one_rank_mesh, {"conv": entry})
