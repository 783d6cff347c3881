"""DeepSeek-V3's plan: experts for expert parallelism, MLA's inner attention for context parallelism, and
tensor parallelism refused with the fix (not supported for MLA yet)."""

import pytest

from titan_models import get_model_spec


def test_plan_names_experts_and_attention_and_refuses_tensor_parallel():
    spec = get_model_spec("deepseek_v3")
    plan = spec.plan(spec.args_for("tiny"))
    assert plan.expert_fqns == ["layers.*.feed_forward.experts"]
    assert plan.attention_fqns == ["layers.*.attention.inner_attention"]
    with pytest.raises(
        ValueError, match="multi-head latent attention .* not supported yet; use parallelism.tensor_parallel_degree = 1"
    ):
        plan.tp_plan(loss_parallel=True)
