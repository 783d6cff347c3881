"""GPT-OSS folders written by transformers itself (save_pretrained of tiny random GptOssConfig) loaded through our
adapter: logits equal to transformers' GptOssForCausalLM (eager attention, eager experts) in float32, atol 1e-4;
and back: our weights exported to Hugging Face names load in transformers with our logits.

The cases are chosen so a mix-up shows: a custom layer_types order, a window (4) much shorter than the sequence
(24), sinks, biases and norms moved off their initial values (transformers initialises sinks normal std 0.02 and
the router and expert biases to zero), a non-default swiglu_limit, top-2 of 6 experts, YaRN or plain RoPE. Each of
sinks, window and attention biases switched off in ours breaks the equality
(test_switching_a_variation_off_breaks_the_equality); the YaRN truncation flag is checked at the frequencies
(test_flavors.py), where head width 64 makes it visible."""

import dataclasses
import json

import pytest
import torch
import transformers  # the reference, titan-models' test extra: missing, this module fails, never skips
from safetensors.torch import load_file, save_file  # transformers' dependency

from titan_models.decoder import Decoder
from titan_models.gpt_oss import GptOssHFAdapter

SEQ_LEN, BATCH = 24, 2
SHAPE = dict(vocab_size=128, hidden_size=64, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, num_local_experts=6, num_experts_per_tok=2, max_position_embeddings=256)  # fmt: skip
YARN = {"rope_type": "yarn", "rope_theta": 5000.0, "factor": 8.0, "original_max_position_embeddings": 32,
        "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}  # fmt: skip
CASES = {
    # Full first, then two windowed layers, then full; YaRN untruncated (GPT-OSS's own); a tight clamp.
    "custom_order_yarn": dict(num_hidden_layers=4, sliding_window=4, swiglu_limit=1.5, rope_parameters=YARN,
                              layer_types=["full_attention", "sliding_attention", "sliding_attention",
                                           "full_attention"]),  # fmt: skip
    # GPT-OSS's alternation (the default layer_types), plain RoPE, no attention biases.
    "alternating_plain_rope": dict(num_hidden_layers=2, sliding_window=4, swiglu_limit=3.0, attention_bias=False,
                                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
}  # fmt: skip


def save_folder(case: str, folder) -> None:
    torch.manual_seed(0)
    config = transformers.GptOssConfig(**SHAPE, **CASES[case])
    model = transformers.GptOssForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
            elif name.endswith(("sinks", "bias")):  # sinks around exp(0) = 1, comparable with a row's scores
                param.normal_(std=1.0)
            elif "experts" in name:
                param.normal_(std=0.2)  # gate / up reach past the small clamp
    model.save_pretrained(folder)


def hf_model(folder) -> torch.nn.Module:
    return transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()


def load_ours(folder, **changes) -> Decoder:
    """Our model from the folder's config.json and weights (through the adapter alone), args changed by `changes`."""
    adapter = GptOssHFAdapter.from_hf_folder(folder)
    model = Decoder(dataclasses.replace(adapter.args, **changes))
    model.init_weights(seed=1)
    model.load_state_dict(adapter.from_hf(load_file(folder / "model.safetensors")), strict=True)
    return model.eval()


def tokens() -> torch.Tensor:
    return torch.randint(0, SHAPE["vocab_size"], (BATCH, SEQ_LEN), generator=torch.Generator().manual_seed(7))


@pytest.fixture(scope="module", params=list(CASES))
def folder(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    save_folder(request.param, path)
    return request.param, path


def test_transformers_folder_gives_transformers_logits(folder):
    case, path = folder
    ours = load_ours(path)
    assert ours.args.layer_types == (CASES[case].get("layer_types") or ["sliding_attention", "full_attention"])
    assert ours.args.sliding_window == 4 and ours.args.moe.swiglu_limit == CASES[case]["swiglu_limit"]
    assert ours.args.attention_sinks and ours.args.attention_bias == CASES[case].get("attention_bias", True)
    assert all(layer.attention.sinks.abs().sum() > 0 for layer in ours.layers.values())
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens()), hf_model(path)(tokens()).logits, atol=1e-4, rtol=0)


def test_our_export_loads_in_transformers_with_our_logits(folder, tmp_path):
    """Ours (randomly initialised, biases and sinks moved) -> Hugging Face names and config.json -> transformers."""
    _, path = folder
    args = GptOssHFAdapter.from_hf_folder(path).args
    ours = Decoder(args)
    ours.init_weights(seed=3)
    with torch.no_grad():
        for name, param in ours.named_parameters():
            if name.endswith(("bias", "sinks")):
                param.normal_(std=0.5)
    adapter = GptOssHFAdapter(args)
    state = {k: v.detach().clone() for k, v in ours.state_dict().items()}
    hf_state = adapter.to_hf(state)
    assert sorted(hf_state) == sorted(adapter.hf_keys())
    save_file({k: v.contiguous() for k, v in hf_state.items()}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(adapter.hf_config(dtype=torch.float32)))
    hf = hf_model(tmp_path)
    assert transformers.GptOssConfig.from_pretrained(tmp_path).layer_types == adapter.hf_config()["layer_types"]
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens()).logits, ours.eval()(tokens()), atol=1e-4, rtol=0)
    back = adapter.from_hf(hf_state)
    assert sorted(back) == sorted(state)
    for key in state:
        torch.testing.assert_close(back[key], state[key], rtol=0, atol=0, msg=key)


def _no_sinks(model: Decoder) -> None:
    for layer in model.layers.values():
        layer.attention.sinks.data.fill_(-torch.inf)  # exp(-inf) = 0: the sink takes no share of the softmax


def _no_attention_biases(model: Decoder) -> None:
    for layer in model.layers.values():
        for linear in (layer.attention.wq, layer.attention.wk, layer.attention.wv, layer.attention.wo):
            if linear.bias is not None:
                linear.bias.data.zero_()


@pytest.mark.parametrize("variation", ["sinks", "window", "attention_biases"])
def test_switching_a_variation_off_breaks_the_equality(variation, tmp_path):
    """The equality above depends on each variation: switched off in ours alone, the logits differ."""
    save_folder("custom_order_yarn", tmp_path)
    changes = {}
    if variation == "window":
        changes = {"sliding_window": None, "layer_types": None}
    ours = load_ours(tmp_path, **changes)
    if variation == "sinks":
        _no_sinks(ours)
    elif variation == "attention_biases":
        _no_attention_biases(ours)
    with torch.no_grad():
        gap = (ours(tokens()) - hf_model(tmp_path)(tokens()).logits).abs().max().item()
    assert gap > 1e-3, f"switching {variation} off left the logits within {gap}"
