"""DeepSeek-V3 sizes against the published figures, counted on the meta device from the built model: the
671B (DeepSeek-V3 report: 671B total, 37B activated) and the 16B (DeepSeek-V2-Lite: 15.7B, 2.4B). Totals
to 0.5%; activated counts (the parameters one token computes with, the embedding lookup aside, as MFU
counts them) to what prints as the published figure (36.63B as 37B, 2.45B as 2.4B)."""

import pytest
import torch

from titan_models import get_model_spec
from titan_models.decoder.flops import count_params

# flavor: (total in billions, [low, high) of the activated count in billions)
PUBLISHED = {"671B": (671.0, (36.5, 37.5)), "16B": (15.7, (2.35, 2.5))}


@pytest.mark.parametrize("flavor", list(PUBLISHED))
def test_parameter_counts_match_the_published_ones(flavor):
    spec = get_model_spec("deepseek_v3")
    args = spec.args_for(flavor)
    with torch.device("meta"):
        model = spec.model_cls(args)
    built = sum(p.numel() for p in model.parameters())
    assert built == count_params(args, exclude_embedding=False)
    total, (low, high) = PUBLISHED[flavor]
    assert abs(built / 1e9 / total - 1) < 0.005, built
    assert low <= count_params(args, active=True) / 1e9 < high


def test_the_671b_shape_is_deepseek_v3s():
    args = get_model_spec("deepseek_v3").args_for("671B")
    moe, mla = args.moe, args.mla
    assert (moe.num_experts, moe.top_k, moe.num_shared_experts, moe.dense_layers) == (256, 8, 1, (0, 1, 2))
    assert (moe.num_expert_groups, moe.num_limited_groups, moe.routed_scaling_factor) == (8, 4, 2.5)
    assert (moe.score_func, moe.load_balance) == ("sigmoid", "aux_loss_free")
    assert (mla.q_lora_rank, mla.kv_lora_rank, mla.qk_head_dim, mla.v_head_dim) == (1536, 512, 192, 128)
    with torch.device("meta"):
        model = get_model_spec("deepseek_v3").model_cls(args)
    attention = model.layers["0"].attention
    assert attention.wq is None and attention.wq_b.weight.shape == (128 * 192, 1536)
    assert attention.wkv_a.weight.shape == (512 + 64, 7168) and attention.wo.weight.shape == (7168, 128 * 128)


def test_mla_attention_flops_count_query_key_and_value_widths():
    spec = get_model_spec("deepseek_v3")
    args = spec.args_for("671B")
    attention = spec.flops_per_token(args, 4096) - spec.flops_per_token(args, 0)
    assert attention == 6 * 61 * 128 * (192 + 128) * 4096
