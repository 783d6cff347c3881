"""Tensor parallelism of a mixture-of-experts layer: against the one-rank layer on 2 and 4 gloo ranks
(moe_tp_script.py), alone and beside expert parallelism over the tp ranks, with and without shared experts, and
the layers it refuses."""

import sys
from pathlib import Path

import pytest
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts beside the tests (importlib mode)

from moe_tp_script import ToyMoE  # noqa: E402
from multiprocess import launch  # noqa: E402

from titan_parallel import apply_tp
from titan_parallel.tp.moe_parallel import MoETensorParallel

SCRIPT = Path(__file__).with_name("moe_tp_script.py")


@pytest.mark.parametrize("world", [2, 4])
def test_every_gradient_equals_the_one_rank_layer(world):
    output = launch(SCRIPT, world)
    cases = (
        "matches_one_rank",
        "with_expert_parallel",
        "with_shared_experts",
        "with_shared_experts_and_expert_parallel",
    )
    missing = [f"rank {r} {c}" for r in range(world) for c in cases if f"rank {r} {c} ok" not in output]
    assert not missing, f"not ok: {missing}\n{output[-6000:]}"


def test_a_layer_without_router_or_experts_is_refused(one_rank_mesh):
    with pytest.raises(TypeError, match=r"Linear is not a mixture-of-experts layer .*declare this style only"):
        apply_tp(nn.Sequential(nn.Linear(2, 2)), one_rank_mesh, {"0": MoETensorParallel()})


def test_shared_experts_are_split_on_their_hidden_units(one_rank_mesh):
    layer = apply_tp(ToyMoE(shared=True), one_rank_mesh, {"": MoETensorParallel()})
    shared = layer.shared_experts
    assert shared.w1.weight.placements[0].dim == 0 and shared.w2.weight.placements[0].dim == 1


def test_a_declared_style_becomes_moe_tensor_parallel(one_rank_mesh):
    class Declared:  # what titan_models.tp_styles.ExpertsHiddenShard is, without importing it
        parallel_style = "experts_hidden_shard"

    layer = apply_tp(ToyMoE(), one_rank_mesh, {"": Declared()})
    assert layer.experts.w1.placements[0].dim == 2 and layer.experts.w2.placements[0].dim == 1
    assert layer.router.gate.weight.placements[0].is_replicate()
