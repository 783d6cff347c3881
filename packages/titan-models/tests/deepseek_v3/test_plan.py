"""DeepSeek-V3's plan: experts for expert parallelism, MLA's inner attention for context parallelism, and MLA's
tensor-parallel entries (latent projections sequence-parallel, head projections column-wise, the rotary key
gathered for each rank's heads)."""

from titan_models import get_model_spec
from titan_models.tp_styles import ExpertsHiddenShard, HeadsShareInput


def test_plan_names_experts_attention_and_mla_tensor_parallel_entries():
    spec = get_model_spec("deepseek_v3")
    args = spec.args_for("tiny")
    plan = spec.plan(args)
    assert plan.expert_fqns == ["layers.*.feed_forward.experts"]
    assert plan.attention_fqns == ["layers.*.attention.inner_attention"]
    assert plan.tp_divisible["moe.num_shared_experts x moe.hidden_dim"] == 32
    tp = plan.tp_plan(loss_parallel=True)
    styles = {fqn.removeprefix("layers.*.attention."): type(style).__name__ for fqn, style in tp.items()
              if fqn.startswith("layers.*.attention.")}  # fmt: skip
    assert styles == {"wq_a": "SequenceParallel", "q_norm": "SequenceParallel", "wkv_a": "SequenceParallel",
                      "kv_norm": "SequenceParallel", "wq_b": "ColwiseParallel", "wkv_b": "ColwiseParallel",
                      "wo": "RowwiseParallel", "rope_key": "HeadsShareInput"}  # fmt: skip
    assert isinstance(tp["layers.*.attention.rope_key"], HeadsShareInput)
    assert isinstance(tp["layers.1.feed_forward"], ExpertsHiddenShard) and "layers.0.feed_forward.w1" in tp


def test_direct_queries_are_column_wise():
    spec = get_model_spec("deepseek_v3")
    tp = spec.plan(spec.args_for("16B")).tp_plan(loss_parallel=False)
    assert type(tp["layers.*.attention.wq"]).__name__ == "ColwiseParallel" and "layers.*.attention.wq_a" not in tp
