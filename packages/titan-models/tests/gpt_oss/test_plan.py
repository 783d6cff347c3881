"""GPT-OSS's tensor-parallel plan: its sinks keyed by parameter beside the attention's own entry, its sparse layers
split on their experts' hidden units (applying them is titan-parallel's, tested on a GPT-OSS-shaped toy there:
packages/titan-parallel/tests/test_gpt_oss_tensor_parallel.py)."""

import dataclasses

from torch.distributed.tensor.parallel import PrepareModuleInput

from titan_models import get_model_spec
from titan_models.tp_styles import ExpertsHiddenShard, ParameterShard


def tp_plan(name: str, flavor: str, **changes) -> tuple[dict, object]:
    spec = get_model_spec(name)
    args = dataclasses.replace(spec.args_for(flavor), **changes)
    return spec.plan(args).tp_plan(loss_parallel=True), args


def test_the_sinks_are_sharded_with_their_heads_beside_the_attentions_entry():
    plan, args = tp_plan("gpt_oss", "tiny")
    assert args.attention_sinks
    assert plan["layers.*.attention.sinks"] == ParameterShard(dim=0)
    assert isinstance(plan["layers.*.attention"], PrepareModuleInput)


def test_the_args_decide_the_sinks_entry():
    plan, _ = tp_plan("gpt_oss", "tiny", attention_sinks=False)
    assert "layers.*.attention.sinks" not in plan
    assert "layers.*.attention.sinks" not in tp_plan("llama3", "debug")[0]


def test_sparse_layers_split_their_experts_hidden_units():
    plan, args = tp_plan("gpt_oss", "tiny")
    assert args.moe.expert_proj_bias and args.moe.router_bias
    for layer in range(args.n_layers):
        assert isinstance(plan[f"layers.{layer}.feed_forward"], ExpertsHiddenShard)
