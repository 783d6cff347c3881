"""Qwen3's tensor-parallel plan: which style each module gets (applying it is titan-parallel's, tested with the
single-process run in integration/test_moe_parity.py)."""

import dataclasses

from torch.distributed.tensor.parallel import ColwiseParallel, SequenceParallel

from titan_models import get_model_spec
from titan_models.tp_styles import ExpertsHiddenShard


def tp_plan(name: str, flavor: str, **moe_changes) -> tuple[dict, object]:
    spec = get_model_spec(name)
    args = spec.args_for(flavor)
    if moe_changes:
        args = dataclasses.replace(args, moe=dataclasses.replace(args.moe, **moe_changes))
    return spec.plan(args).tp_plan(loss_parallel=True), args


def test_query_and_key_norms_see_this_ranks_heads():
    plan, _ = tp_plan("qwen3", "tiny")
    for norm in ("q_norm", "k_norm"):
        style = plan[f"layers.*.attention.{norm}"]
        assert isinstance(style, SequenceParallel) and style.sequence_sharding[0].dim == 2


def test_sparse_layers_split_their_experts_and_dense_layers_their_linears():
    plan, args = tp_plan("qwen3_moe", "tiny")
    sparse = [layer for layer in range(args.n_layers) if args.is_sparse(layer)]
    assert sparse == [1, 2, 3]  # tiny: layer 0 dense (mlp_only_layers)
    assert not [key for key in plan if key.startswith("layers.*.feed_forward")]
    for layer in range(args.n_layers):
        if layer in sparse:
            assert isinstance(plan[f"layers.{layer}.feed_forward"], ExpertsHiddenShard)
            assert f"layers.{layer}.feed_forward.w1" not in plan
        else:
            assert isinstance(plan[f"layers.{layer}.feed_forward.w1"], ColwiseParallel)
    assert get_model_spec("qwen3_moe").plan(args).tp_divisible["moe.hidden_dim"] == args.moe.hidden_dim


def test_shared_experts_split_with_their_layer():
    # MoETensorParallel splits them inside the layer: no entries of their own.
    plan, args = tp_plan("qwen3_moe", "tiny", num_shared_experts=1)
    assert isinstance(plan["layers.1.feed_forward"], ExpertsHiddenShard)
    assert not [key for key in plan if "shared_experts" in key]
