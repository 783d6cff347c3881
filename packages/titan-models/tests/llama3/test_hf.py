"""Hugging Face LlamaForCausalLM mapping. Reference: a transcription of HF's modeling_llama forward
(rotate_half RoPE on q/k halves) in this file; tolerance atol 1e-5 on logits."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from titan_models.llama3 import FLAVORS, Llama3HFAdapter, RopeScaling, args_from_hf_config, hf_config


def hf_inv_freq(config: dict) -> torch.Tensor:
    """transformers' default and "llama3" rope init (_compute_llama3_parameters)."""
    head_dim = config["head_dim"]
    inv_freq = 1.0 / (config["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    scaling = config["rope_scaling"]
    if scaling is None:
        return inv_freq
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_context_len / low, old_context_len / high
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def hf_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return weight * (x.float() * torch.rsqrt(variance + eps)).to(x.dtype)


def hf_llama_logits(sd: dict[str, torch.Tensor], config: dict, tokens: torch.Tensor) -> torch.Tensor:
    bs, seqlen = tokens.shape
    n_heads, n_kv, head_dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    eps = config["rms_norm_eps"]
    freqs = torch.outer(torch.arange(seqlen).float(), hf_inv_freq(config))
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    causal = torch.ones(seqlen, seqlen).tril().bool()

    h = sd["model.embed_tokens.weight"][tokens]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = hf_rms_norm(h, sd[p + "input_layernorm.weight"], eps)
        q = (x @ sd[p + "self_attn.q_proj.weight"].T).view(bs, seqlen, n_heads, head_dim).transpose(1, 2)
        k = (x @ sd[p + "self_attn.k_proj.weight"].T).view(bs, seqlen, n_kv, head_dim).transpose(1, 2)
        v = (x @ sd[p + "self_attn.v_proj.weight"].T).view(bs, seqlen, n_kv, head_dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(n_heads // n_kv, dim=1), v.repeat_interleave(n_heads // n_kv, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(head_dim)
        attn = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        h = h + attn.transpose(1, 2).reshape(bs, seqlen, -1) @ sd[p + "self_attn.o_proj.weight"].T
        x = hf_rms_norm(h, sd[p + "post_attention_layernorm.weight"], eps)
        gate, up = x @ sd[p + "mlp.gate_proj.weight"].T, x @ sd[p + "mlp.up_proj.weight"].T
        h = h + (F.silu(gate) * up) @ sd[p + "mlp.down_proj.weight"].T
    return hf_rms_norm(h, sd["model.norm.weight"], eps) @ sd["lm_head.weight"].T


@pytest.mark.parametrize("rope_scaling", [None, RopeScaling()], ids=["plain", "llama3.1-scaled"])
def test_hf_layout_computes_the_same_logits(build, rope_scaling):
    # Un-normalized norm weights, so a mix-up between the two norms (or their HF names) shows.
    model = build("tiny", seed=0, rope_scaling=rope_scaling)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(len(name)))
    adapter = Llama3HFAdapter(model.args)
    hf_sd = adapter.to_hf(model.state_dict())
    tokens = torch.randint(0, 2048, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(tokens)
        theirs = hf_llama_logits(hf_sd, hf_config(model.args), tokens)
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)


def test_round_trip_and_hf_key_names(build):
    model = build("tiny")
    adapter = Llama3HFAdapter(model.args)
    ours = model.state_dict()
    hf_sd = adapter.to_hf(ours)
    assert sorted(hf_sd) == sorted(adapter.hf_keys())
    assert set(adapter.hf_keys()) >= {
        "model.embed_tokens.weight",
        "model.layers.1.self_attn.q_proj.weight",
        "model.layers.1.self_attn.k_proj.weight",
        "model.layers.1.self_attn.v_proj.weight",
        "model.layers.1.self_attn.o_proj.weight",
        "model.layers.1.mlp.gate_proj.weight",
        "model.layers.1.mlp.up_proj.weight",
        "model.layers.1.mlp.down_proj.weight",
        "model.layers.1.input_layernorm.weight",
        "model.layers.1.post_attention_layernorm.weight",
        "model.norm.weight",
        "lm_head.weight",
    }
    assert len(adapter.hf_keys()) == 3 + 9 * model.args.n_layers
    # Names only where nothing is permuted; q/k rows are reordered.
    assert torch.equal(hf_sd["model.layers.0.mlp.gate_proj.weight"], ours["layers.0.feed_forward.w1.weight"])
    assert torch.equal(hf_sd["model.layers.0.mlp.up_proj.weight"], ours["layers.0.feed_forward.w3.weight"])
    assert not torch.equal(hf_sd["model.layers.0.self_attn.q_proj.weight"], ours["layers.0.attention.wq.weight"])
    back = adapter.from_hf(hf_sd)
    assert back.keys() == ours.keys()
    for name, tensor in ours.items():
        assert torch.equal(back[name], tensor), name


def test_tensor_by_tensor_streaming_matches_whole_dict(build):
    model = build("tiny")
    adapter = Llama3HFAdapter(model.args)
    whole = adapter.to_hf(model.state_dict())
    for fqn, tensor in model.state_dict().items():
        hf_key = adapter.to_hf_key(fqn)
        assert adapter.from_hf_key(hf_key) == fqn
        assert torch.equal(adapter.to_hf_tensor(fqn, tensor), whole[hf_key])
        assert torch.equal(adapter.from_hf_tensor(hf_key, whole[hf_key]), tensor)


def test_unknown_names_are_rejected():
    adapter = Llama3HFAdapter(FLAVORS["tiny"])
    with pytest.raises(ValueError, match="not a Llama 3 parameter name"):
        adapter.to_hf_key("layers.0.attention.wx.weight")
    n = FLAVORS["tiny"].n_layers
    with pytest.raises(ValueError, match=f"layer {n} does not exist"):
        adapter.to_hf_key(f"layers.{n}.attention.wq.weight")
    with pytest.raises(ValueError, match="not a LlamaForCausalLM parameter name"):
        adapter.from_hf_key("model.layers.0.self_attn.rotary_emb.inv_freq")


@pytest.mark.parametrize("flavor", ["tiny", "debug", "1B", "8B", "405B"])
def test_hf_config_round_trip(flavor):
    args = FLAVORS[flavor]
    config = hf_config(args, torch.bfloat16, bos_token_id=128000, eos_token_id=128001)
    assert config["architectures"] == ["LlamaForCausalLM"] and config["dtype"] == "bfloat16"  # transformers 5's key
    assert "torch_dtype" not in config and config["max_position_embeddings"] == args.max_seq_len
    assert config["tie_word_embeddings"] is args.tie_word_embeddings and config["intermediate_size"] == args.hidden_dim
    back = args_from_hf_config(config)
    assert hf_config(back, torch.bfloat16, bos_token_id=128000, eos_token_id=128001) == config
    # Same model; only how the FFN width and an implicit n_kv_heads are written may differ.
    assert back.hidden_dim == args.hidden_dim and back.num_kv_heads == args.num_kv_heads
    spelled_like_args = dataclasses.replace(
        back,
        ffn_hidden_dim=args.ffn_hidden_dim,
        multiple_of=args.multiple_of,
        ffn_dim_multiplier=args.ffn_dim_multiplier,
        n_kv_heads=args.n_kv_heads,
    )
    assert spelled_like_args == args


def test_published_8b_config_values():
    config = hf_config(FLAVORS["8B"], "bfloat16")
    assert config["rope_scaling"] == {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    assert (config["hidden_size"], config["intermediate_size"], config["num_key_value_heads"]) == (
        4096,
        14336,
        8,
    )


def test_transformers_v5_rope_parameters_are_read():
    config = hf_config(FLAVORS["8B"])
    rope = {"rope_theta": config.pop("rope_theta"), **config.pop("rope_scaling")}
    config["rope_parameters"] = rope
    assert args_from_hf_config(config).rope_scaling == RopeScaling()


def test_published_3_2_config_values():
    """Llama 3.2 1B's config.json (meta-llama/Llama-3.2-1B), the keys that shape the model."""
    config = hf_config(FLAVORS["1B"], "bfloat16", bos_token_id=128000, eos_token_id=128001)
    published = {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_attention_heads": 32,
        "num_hidden_layers": 16,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 32.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "tie_word_embeddings": True,
        "vocab_size": 128256,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "dtype": "bfloat16",
    }
    assert {k: config[k] for k in published} == published
    # transformers 5 reads rope_parameters, older readers (vLLM, TGI) rope_theta / rope_scaling: same values.
    assert config["rope_parameters"] == {**published["rope_scaling"], "rope_theta": 500000.0}


def test_tied_config_builds_a_tied_model_with_one_matrix(build):
    args = args_from_hf_config(hf_config(FLAVORS["tiny"]) | {"tie_word_embeddings": True})
    assert args.tie_word_embeddings
    model = build("tiny", tie_word_embeddings=True)  # built on meta, to_empty, init_weights: the tie survives
    assert model.output.weight is model.tok_embeddings.weight
    assert len(list(model.parameters())) == len(model.state_dict()) - 1


def test_tied_adapter_stores_the_matrix_once_and_fills_both_names(build):
    model = build("tiny", tie_word_embeddings=True)
    adapter = Llama3HFAdapter(model.args)
    assert "lm_head.weight" not in adapter.hf_keys() and adapter.aliases() == {"output.weight": "tok_embeddings.weight"}
    hf_sd = adapter.to_hf(model.state_dict())
    assert sorted(hf_sd) == sorted(adapter.hf_keys())
    back = adapter.from_hf(hf_sd)
    assert torch.equal(back["output.weight"], model.tok_embeddings.weight)
    untied = Llama3HFAdapter(FLAVORS["tiny"])
    assert "lm_head.weight" in untied.hf_keys() and untied.aliases() == {}


def test_tied_model_trains_one_matrix(build):
    """The gradient of the shared matrix is the sum of both uses (reference: an untied copy whose two
    gradients are added), and one optimizer step keeps the two names equal."""
    tied = build("tiny", tie_word_embeddings=True)
    untied = build("tiny")
    untied.load_state_dict(tied.state_dict())
    tokens = torch.randint(0, 2048, (2, 9), generator=torch.Generator().manual_seed(0))
    for model in (tied, untied):
        F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
    expected = untied.tok_embeddings.weight.grad + untied.output.weight.grad
    torch.testing.assert_close(tied.tok_embeddings.weight.grad, expected, atol=1e-6, rtol=0)
    torch.optim.SGD(tied.parameters(), lr=0.1).step()
    assert torch.equal(tied.output.weight, tied.tok_embeddings.weight)


def test_entry_point_is_registered():
    from importlib.metadata import entry_points

    (entry,) = entry_points(group="titan.hf_adapters", name="llama3")
    assert entry.load() is Llama3HFAdapter


def test_adapter_can_be_built_from_plain_data():
    """How titan-checkpoint builds it after loading the entry point: from a flavor name, from args stored as
    a dict in checkpoint metadata, or from a config.json."""
    args = FLAVORS["8B"]
    from_old_fingerprint = Llama3HFAdapter.from_fingerprint(
        {"flavor": "8B", "args": {k: v for k, v in dataclasses.asdict(args).items() if k != "max_seq_len"}}
    )
    assert from_old_fingerprint.args == args and from_old_fingerprint.hf_config()["max_position_embeddings"] == 131072
    from_flavor = Llama3HFAdapter.from_flavor("8B")
    from_dict = Llama3HFAdapter.from_args_dict(dataclasses.asdict(args))
    from_config = Llama3HFAdapter.from_hf_config(hf_config(args))
    assert from_flavor.args == from_dict.args == args
    assert from_config.hf_config() == from_flavor.hf_config() == hf_config(args)


def test_a_pipeline_stage_holding_the_tied_head_without_the_embedding_is_refused(build):
    model = build("tiny", tie_word_embeddings=True)
    model.tok_embeddings = None  # a last stage without the copy of the embedding the plan shares with it
    with pytest.raises(ValueError, match="tie_word_embeddings=True needs the token embedding beside the output"):
        model.init_weights(seed=0)


def test_pipeline_stages_of_a_tied_model_draw_the_matrix_alike(build):
    # The first stage holds the embedding alone, the last a copy beside the head (decoder_plan's shared_input_fqns).
    first, last, whole = (build("tiny", tie_word_embeddings=True) for _ in range(3))
    first.output = None
    for model in (first, last, whole):
        model.init_weights(seed=0)
    assert last.output.weight is last.tok_embeddings.weight
    torch.testing.assert_close(first.tok_embeddings.weight, whole.tok_embeddings.weight, rtol=0, atol=0)
    torch.testing.assert_close(last.output.weight, whole.output.weight, rtol=0, atol=0)
