"""GPT-OSS's attention variations as DecoderArgs data: validation, per-layer windows, the Attention module with
biases and sinks against a plain reference (fp32, atol 1e-5), their init, and Hugging Face's own GPT-OSS
eager_attention_forward and mask functions (transformers, where installed)."""

import dataclasses
import logging

import pytest
import torch

from titan_models.decoder import Decoder, DecoderArgs, attention_kernels, count_params, num_params
from titan_models.decoder.attention import Attention
from titan_models.decoder.attention_kernels import variant_attention
from titan_models.decoder.rope import apply_rotary_emb, precompute_freqs_cis
from titan_models.seeded_init import seed_for

TOL = dict(atol=1e-5, rtol=1e-5)
TINY = DecoderArgs(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=128, max_seq_len=64)
GPT_OSS_LIKE = dataclasses.replace(
    TINY,
    attention_bias=True,
    attention_sinks=True,
    sliding_window=3,
    layer_types=["sliding_attention", "full_attention"] * 2,
)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(sliding_window=0), r"Llama3Args.sliding_window=0 must be a positive integer .* or None \(no window\)"),
        (dict(sliding_window=-4), r"Llama3Args.sliding_window=-4 must be a positive integer"),
        (dict(sliding_window=True), r"Llama3Args.sliding_window=True must be a positive integer"),
        (
            dict(sliding_window=8, layer_types=["full_attention"] * 3),
            r"Llama3Args.layer_types has 3 entries but n_layers=4; give one entry per layer, each one of "
            r"\('full_attention', 'sliding_attention', 'linear_attention'\), or None",
        ),
        (
            dict(sliding_window=8, layer_types=["full_attention", "local", "full_attention", "full_attention"]),
            r"Llama3Args.layer_types\[1\]='local' is not one of "
            r"\('full_attention', 'sliding_attention', 'linear_attention'\)",
        ),
        (
            dict(layer_types=["full_attention", "sliding_attention"] * 2),
            r"Llama3Args.layer_types\[1\]='sliding_attention' needs Llama3Args.sliding_window, which is None; set "
            r"the window or make the layer 'full_attention'",
        ),
        (dict(attention_sinks=1), r"Llama3Args.attention_sinks=1 must be true or false"),
        (dict(attention_bias="yes"), r"Llama3Args.attention_bias='yes' must be true or false"),
        (dict(attention_kernel="flash"), r"Llama3Args.attention_kernel='flash' is not one of \('auto', 'sdpa'"),
    ],
)
def test_validation_names_field_value_and_fix(overrides, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(TINY, **overrides).validate()


def test_mla_refuses_the_grouped_query_variations():
    from titan_models.decoder import MLAArgs

    args = dataclasses.replace(TINY, mla=MLAArgs(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8))
    args.validate()
    with pytest.raises(ValueError, match=r"Llama3Args.attention_sinks=True applies to grouped-query attention only"):
        dataclasses.replace(args, attention_sinks=True).validate()


def test_defaults_add_nothing():
    """Existing models and checkpoints: no new parameter, no window, the plain kernel path."""
    model = Decoder(TINY)
    names = [n for n, _ in model.named_parameters()]
    assert not any(n.endswith(("sinks", "bias")) for n in names), names
    assert all(layer.attention.inner_attention.sliding_window is None for layer in model.layers.values())


def test_count_params_counts_biases_and_sinks():
    model = Decoder(GPT_OSS_LIKE)
    assert count_params(GPT_OSS_LIKE) == num_params(model)
    assert count_params(GPT_OSS_LIKE) - count_params(TINY) == 4 * (4 * 16 + 2 * 2 * 16 + 64 + 4)


def test_window_per_layer_follows_layer_types():
    model = Decoder(GPT_OSS_LIKE)
    assert [layer.attention.sliding_window for layer in model.layers.values()] == [3, None, 3, None]
    assert [layer.attention.inner_attention.sliding_window for layer in model.layers.values()] == [3, None, 3, None]
    everywhere = dataclasses.replace(TINY, sliding_window=5)  # layer_types None: every layer slides (Mistral)
    assert [everywhere.window_for(i) for i in range(4)] == [5, 5, 5, 5]


def test_init_draws_sinks_from_their_seed_and_zeroes_biases():
    with torch.device("meta"):
        model = Decoder(GPT_OSS_LIKE)
    model.to_empty(device="cpu")
    model.init_weights(seed=7)
    for i, layer in model.layers.items():
        attention = layer.attention
        expected = torch.empty(GPT_OSS_LIKE.n_heads)
        generator = torch.Generator().manual_seed(seed_for(7, f"layers.{i}.attention.sinks"))
        torch.nn.init.normal_(expected, std=0.02, generator=generator)
        torch.testing.assert_close(attention.sinks.detach(), expected, atol=0, rtol=0)
        for linear in (attention.wq, attention.wk, attention.wv, attention.wo):
            assert torch.equal(linear.bias, torch.zeros_like(linear.bias))


def module_reference(reference, attention, args, x, freqs_cis, document_ids=None, bias=True, sinks=True, window=True):
    """The attention block written out: biased projections, RoPE, the plain softmax-with-sink reference."""
    bs, seqlen, _ = x.shape

    def linear(module, inputs):
        return inputs @ module.weight.T + (module.bias if bias else 0)

    q = linear(attention.wq, x).view(bs, seqlen, args.n_heads, args.head_dim)
    k = linear(attention.wk, x).view(bs, seqlen, args.num_kv_heads, args.head_dim)
    v = linear(attention.wv, x).view(bs, seqlen, args.num_kv_heads, args.head_dim)
    q, k = apply_rotary_emb(q, k, freqs_cis)
    out = reference(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        document_ids=document_ids,
        sinks=attention.sinks if sinks else None,
        window=args.sliding_window if window else None,
    )
    return linear(attention.wo, out.transpose(1, 2).reshape(bs, seqlen, -1))


def random_attention(args, seed=0):
    torch.manual_seed(seed)
    attention = Attention(args, layer_id=0)
    with torch.no_grad():
        for parameter in attention.parameters():
            parameter.normal_(std=0.3)  # biases and sinks large enough to matter
    x = torch.randn(2, 11, args.dim)
    document_ids = torch.tensor([[0] * 5 + [1] * 6, [0] * 11])
    return attention, x, precompute_freqs_cis(args.head_dim, 11, args.rope_theta), document_ids


@pytest.mark.parametrize("kernel", ["auto", "eager", "flex"])
def test_attention_module_equals_the_reference(kernel, reference):
    args = dataclasses.replace(GPT_OSS_LIKE, attention_kernel=kernel)
    attention, x, freqs_cis, document_ids = random_attention(args)
    with torch.no_grad():
        actual = attention(x, freqs_cis, document_ids=document_ids)
        expected = module_reference(reference, attention, args, x, freqs_cis, document_ids)
    torch.testing.assert_close(actual, expected, **TOL)


@pytest.mark.parametrize("feature", ["bias", "sinks", "window"])
def test_each_feature_switched_off_breaks_module_equality(feature, reference):
    attention, x, freqs_cis, document_ids = random_attention(GPT_OSS_LIKE)
    with torch.no_grad():
        actual = attention(x, freqs_cis, document_ids=document_ids)
        without = module_reference(reference, attention, GPT_OSS_LIKE, x, freqs_cis, document_ids, **{feature: False})
    assert not torch.allclose(actual, without, **TOL)


def test_sinks_are_trained():
    attention, x, freqs_cis, _ = random_attention(GPT_OSS_LIKE)
    attention(x, freqs_cis).square().sum().backward()
    assert attention.sinks.grad is not None and attention.sinks.grad.abs().sum() > 0
    assert attention.wq.bias.grad.abs().sum() > 0


def test_the_model_runs_with_every_variation_and_documents():
    torch.manual_seed(0)
    model = Decoder(GPT_OSS_LIKE)
    model.init_weights(seed=0)
    tokens = torch.randint(0, GPT_OSS_LIKE.vocab_size, (2, 12))
    document_ids = torch.tensor([[0] * 4 + [1] * 8, [0] * 12])
    logits = model(tokens, document_ids=document_ids)
    logits.float().mean().backward()
    assert logits.shape == (2, 12, GPT_OSS_LIKE.vocab_size) and torch.isfinite(logits).all()
    # Block-causal: the second document of row 0 reads nothing of the first.
    changed = tokens.clone()
    changed[0, :4] = (tokens[0, :4] + 1) % GPT_OSS_LIKE.vocab_size
    with torch.no_grad():
        torch.testing.assert_close(model(changed, document_ids=document_ids)[0, 4:], logits[0, 4:], **TOL)


def test_hugging_face_gpt_oss_attention_and_masks_agree(random_case):
    """Hugging Face's own eager_attention_forward (GPT-OSS) over a mask from its own mask functions
    (sliding_window_causal_mask_function and packed_sequence_mask_function) equals every kernel here."""
    from transformers.masking_utils import and_masks, packed_sequence_mask_function, sliding_window_causal_mask_function
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    case = random_case(11, kv_heads=2)
    bs, heads, seqlen, head_dim = case["q"].shape
    mask_fn = and_masks(
        sliding_window_causal_mask_function(case["window"]), packed_sequence_mask_function(case["document_ids"])
    )
    b, i, j = torch.arange(bs)[:, None, None], torch.arange(seqlen)[None, :, None], torch.arange(seqlen)[None, None, :]
    keep = mask_fn(b, torch.tensor(0), i, j).expand(bs, seqlen, seqlen)  # its functions broadcast, as under vmap
    additive = torch.zeros(bs, 1, seqlen, seqlen).masked_fill(~keep[:, None], float("-inf"))
    module = torch.nn.Module()
    module.sinks, module.num_key_value_groups = case["sinks"], heads // case["k"].shape[1]
    expected, _ = eager_attention_forward(module, case["q"], case["k"], case["v"], additive, scaling=head_dim**-0.5)
    for kernel in ("eager", "flex"):
        with torch.no_grad():
            actual = variant_attention(**case, kernel=kernel).transpose(1, 2)
        torch.testing.assert_close(actual, expected, **TOL)
    # The convention itself: a window of W keeps W keys, the query's own included.
    assert int(keep[0].sum(-1).max()) <= case["window"]


@pytest.mark.parametrize("args", [TINY, GPT_OSS_LIKE], ids=["plain", "gpt-oss-like"])
def test_attention_compiles_as_one_graph(args, monkeypatch, caplog):
    """Blocks are compiled with fullgraph=True (titan_parallel.apply_compile): choosing and logging the kernel
    must not break the graph (inside it the kernel logs nothing; Attention.kernel_name names it beforehand)."""
    monkeypatch.setattr(attention_kernels, "_LOGGED", set())
    torch._dynamo.reset()
    attention, x, freqs_cis, document_ids = random_attention(args)
    compiled = torch.compile(attention, fullgraph=True, backend="aot_eager")
    with caplog.at_level(logging.INFO, logger=attention_kernels.__name__):
        out = compiled(x, freqs_cis, document_ids=document_ids)
    out.sum().backward()
    assert not [r for r in caplog.records if r.getMessage().startswith("attention kernel: ")]
    with torch.no_grad():
        torch.testing.assert_close(out, attention(x, freqs_cis, document_ids=document_ids), **TOL)


def test_kernel_name_per_layer():
    model = Decoder(GPT_OSS_LIKE)
    names = [layer.attention.kernel_name("cpu") for layer in model.layers.values()]
    assert names == ["eager"] * 4  # sinks everywhere: no SDPA; FlexAttention has no backward on CPU
    assert [layer.attention.kernel_name("cuda") for layer in model.layers.values()] == ["flex"] * 4
    plain = Decoder(TINY).layers["0"].attention
    assert plain.kernel_name("cpu") == plain.kernel_name("cuda") == "sdpa"
    windows_only = Decoder(dataclasses.replace(GPT_OSS_LIKE, attention_sinks=False)).layers
    assert [layer.attention.kernel_name("cpu") for layer in windows_only.values()] == ["sdpa"] * 4
