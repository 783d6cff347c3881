"""Qwen3-Next folders written by transformers itself (save_pretrained of a tiny random Qwen3NextConfig) loaded through
our adapter: logits equal to transformers' Qwen3NextForCausalLM (eager attention, eager experts, its torch gated
delta rule) in float32; and back: our weights exported to Hugging Face names load in transformers with our logits.

The case is chosen so a mix-up shows: an unusual layer_types order (full attention first and last, two Gated
DeltaNet layers between), 3 query heads per key/value head, partial RoPE (a quarter of each 32-wide head), a dense
layer among the sparse ones (mlp_only_layers), a shared expert twice an expert's width, and every norm and gate moved
off its initial value (transformers initialises the zero-centred norms at 0 and the gated norm at 1, where a mix-up
of the two conventions would not show). Each of the output gate, the zero-centring and the shared-expert gate
switched off in ours breaks the equality (test_switching_a_variation_off_breaks_the_equality)."""

import json

import pytest
import torch
import transformers  # the reference, titan-models' test extra: missing, this module fails, never skips
from safetensors.torch import load_file, save_file  # transformers' dependency

from titan_models.decoder import Decoder
from titan_models.qwen3_next import Qwen3NextHFAdapter

SEQ_LEN, BATCH = 24, 2
LAYER_TYPES = ["full_attention", "linear_attention", "linear_attention", "full_attention"]
CONFIG = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=6,
    num_key_value_heads=2, head_dim=32, max_position_embeddings=256, layer_types=LAYER_TYPES,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=8, linear_num_key_heads=2,
    linear_num_value_heads=4, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
    shared_expert_intermediate_size=64, norm_topk_prob=True, mlp_only_layers=[2], rms_norm_eps=1e-6,
)  # fmt: skip


def save_folder(folder) -> None:
    torch.manual_seed(0)
    model = transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(**CONFIG))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(-0.5, 0.5) if "linear_attn" not in name else param.uniform_(0.5, 1.5)
            elif name.endswith(("A_log", "dt_bias")):
                param.uniform_(-1.0, 1.0)
            elif "experts" in name or "shared_expert" in name or name.endswith("mlp.gate.weight"):
                param.normal_(std=0.3)
            elif param.ndim == 2:
                param.normal_(std=0.15)
    model.save_pretrained(folder)


def hf_model(folder) -> torch.nn.Module:
    return transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()


def load_ours(folder) -> Decoder:
    """Our model from the folder's config.json and weights, through the adapter alone."""
    adapter = Qwen3NextHFAdapter.from_hf_folder(folder)
    model = Decoder(adapter.args)
    model.init_weights(seed=1)
    model.load_state_dict(adapter.from_hf(load_file(folder / "model.safetensors")), strict=True)
    return model.eval()


def tokens() -> torch.Tensor:
    return torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ_LEN), generator=torch.Generator().manual_seed(7))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3_next")
    save_folder(path)
    return path


def test_the_folder_reads_as_its_config(folder):
    args = Qwen3NextHFAdapter.from_hf_folder(folder).args
    assert args.layer_types == LAYER_TYPES and args.rope_head_dim == 8 and args.num_kv_heads == 2
    assert args.moe.num_shared_experts == 2 and args.moe.shared_expert_gate and not args.is_sparse(2)
    keys = set(load_file(folder / "model.safetensors"))
    assert keys == set(Qwen3NextHFAdapter(args).hf_keys())


def test_transformers_folder_gives_transformers_logits(folder):
    with torch.no_grad():
        torch.testing.assert_close(load_ours(folder)(tokens()), hf_model(folder)(tokens()).logits, atol=1e-4, rtol=0)


def test_our_export_loads_in_transformers_with_our_logits(folder, tmp_path):
    """Ours (randomly initialised, norms moved off 0) -> Hugging Face names and config.json -> transformers."""
    args = Qwen3NextHFAdapter.from_hf_folder(folder).args
    ours = Decoder(args)
    ours.init_weights(seed=3)
    with torch.no_grad():
        for name, param in ours.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(torch.empty_like(param).uniform_(-0.5, 0.5))
    adapter = Qwen3NextHFAdapter(args)
    state = {k: v.detach().clone() for k, v in ours.state_dict().items()}
    hf_state = adapter.to_hf(state)
    assert sorted(hf_state) == sorted(adapter.hf_keys())
    save_file({k: v.contiguous() for k, v in hf_state.items()}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(adapter.hf_config(dtype=torch.float32)))
    assert transformers.Qwen3NextConfig.from_pretrained(tmp_path).layer_types == LAYER_TYPES
    with torch.no_grad():
        torch.testing.assert_close(hf_model(tmp_path)(tokens()).logits, ours.eval()(tokens()), atol=1e-4, rtol=0)
    back = adapter.from_hf(hf_state)
    assert sorted(back) == sorted(state)
    for key in state:
        torch.testing.assert_close(back[key], state[key], rtol=0, atol=0, msg=key)


def _switch_off(model: Decoder, variation: str) -> None:
    for module in model.modules():
        if variation == "output_gate" and hasattr(module, "output_gate") and module.output_gate:
            # The query rows stay where they are; the gate is read as 1 instead of sigmoid(gate).
            original = module._project

            def ungated(x, freqs_cis, original=original):
                xq, xk, xv, gate = original(x, freqs_cis)
                return xq, xk, xv, torch.full_like(gate, torch.inf)  # sigmoid(inf) = 1

            module._project = ungated
        elif variation == "zero_centring" and getattr(module, "zero_centered", False):
            module.zero_centered = False  # scale by weight, not 1 + weight
        elif variation == "shared_expert_gate" and getattr(module, "shared_expert_gate", None) is not None:
            module.shared_expert_gate = None  # the shared expert's output added whole


@pytest.mark.parametrize("variation", ["output_gate", "zero_centring", "shared_expert_gate"])
def test_switching_a_variation_off_breaks_the_equality(variation, folder):
    """The equality above depends on each variation: switched off in ours alone, the logits differ."""
    ours = load_ours(folder)
    _switch_off(ours, variation)
    with torch.no_grad():
        gap = (ours(tokens()) - hf_model(folder)(tokens()).logits).abs().max().item()
    assert gap > 1e-2, f"switching {variation} off left the logits within {gap}"
