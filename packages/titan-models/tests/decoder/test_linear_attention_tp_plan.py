"""The decoder's tensor-parallel plan where some layers are linear attention (Qwen3-Next): per-layer entries, the
Gated DeltaNet's where a layer holds `linear_attn`, the attention's where it holds `attention`, none naming a module
a layer lacks; the convolution split in its q | k | v blocks. (Applying them, against one process:
titan-parallel's tests/test_qwen3_next_tensor_parallel.py on a toy, titan-train's tests/qwen3_next_tp_checks.py on
the model.)"""

import dataclasses

import torch
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

from titan_models.decoder import Decoder, decoder_tp_plan
from titan_models.qwen3_next import FLAVORS, qwen3_next_plan
from titan_models.tp_styles import ChannelShard, ExpertsHiddenShard, ParameterShard

TINY = FLAVORS["tiny"]


def test_linear_layers_get_the_gated_deltanets_entries_and_the_others_the_attentions():
    plan = qwen3_next_plan(TINY).tp_plan(loss_parallel=True)
    la = TINY.linear_attention
    assert [TINY.is_linear_attention(i) for i in range(TINY.n_layers)] == [True, True, True, False]
    for layer in range(3):
        prefix = f"layers.{layer}.linear_attn"
        assert isinstance(plan[prefix], PrepareModuleInput)
        assert isinstance(plan[f"{prefix}.in_proj_qkvz"], ColwiseParallel)
        assert isinstance(plan[f"{prefix}.in_proj_ba"], ColwiseParallel)
        assert plan[f"{prefix}.conv1d"] == ChannelShard(("weight",), blocks=(la.key_dim, la.key_dim, la.value_dim))
        assert plan[f"{prefix}.A_log"] == plan[f"{prefix}.dt_bias"] == ParameterShard(dim=0)
        assert plan[f"{prefix}.norm"] == ChannelShard(())
        assert isinstance(plan[f"{prefix}.out_proj"], RowwiseParallel)
        assert not any(key.startswith(f"layers.{layer}.attention.") for key in plan)
    for name in ("wq", "wk", "wv", "wo", "q_norm", "k_norm"):
        assert f"layers.3.attention.{name}" in plan
    assert not any(key.startswith(("layers.*.attention.", "layers.*.linear_attn")) for key in plan)
    assert all(isinstance(plan[f"layers.{i}.feed_forward"], ExpertsHiddenShard) for i in range(TINY.n_layers))


def test_every_entry_names_a_module_or_parameter_every_layer_it_matches_holds():
    """With no wildcard left over a token mixer, `layers.*` entries name what every layer holds (the norms, the
    feed-forward), and per-layer entries what their layer holds: apply_tp warns of none and skips none."""
    with torch.device("meta"):
        model = Decoder(TINY)
    modules, params = dict(model.named_modules()), dict(model.named_parameters())
    for key in decoder_tp_plan(TINY):
        for fqn in {key.replace("*", str(layer)) for layer in range(TINY.n_layers)}:
            assert modules.get(fqn) is not None or fqn in params, (key, fqn)


def test_the_key_head_groups_must_split():
    assert qwen3_next_plan(TINY).tp_divisible["linear_attention.n_key_heads"] == TINY.linear_attention.n_key_heads
    assert (
        "linear_attention.n_key_heads"
        not in qwen3_next_plan(dataclasses.replace(TINY, layer_types=None, linear_attention=None)).tp_divisible
    )


def test_decoders_without_linear_attention_keep_the_wildcard_entries():
    args = dataclasses.replace(TINY, layer_types=None, linear_attention=None)
    plan = decoder_tp_plan(args)
    assert "layers.*.attention.wq" in plan and not any("linear_attn" in key for key in plan)
