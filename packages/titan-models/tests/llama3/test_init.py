"""TorchTitan's Llama 3 initialization, built meta -> to_empty -> init_weights."""

import pytest
import torch

from titan_models.decoder.rope import precompute_freqs_cis

# A normal truncated at +-3 std has std 0.9866 * std.
TRUNC3 = 0.9866


def test_init_statistics(build):
    model = build("debug", seed=0)
    args = model.args
    assert model.tok_embeddings.weight.std().item() == pytest.approx(1.0, rel=0.02)
    assert model.output.weight.std().item() == pytest.approx(TRUNC3 * args.dim**-0.5, rel=0.02)
    assert model.output.weight.abs().max().item() <= 3 * args.dim**-0.5
    assert torch.equal(model.norm.weight, torch.ones(args.dim))
    for i, layer in model.layers.items():
        depth_std = 0.02 / (2 * (int(i) + 1)) ** 0.5
        for linear in (layer.attention.wq, layer.attention.wk, layer.attention.wv, layer.feed_forward.w1):
            assert linear.weight.std().item() == pytest.approx(0.02, rel=0.05)
        for linear in (layer.attention.wo, layer.feed_forward.w2, layer.feed_forward.w3):
            assert linear.weight.std().item() == pytest.approx(depth_std, rel=0.05), (i, linear)
        assert torch.equal(layer.attention_norm.weight, torch.ones(args.dim))
        assert torch.equal(layer.ffn_norm.weight, torch.ones(args.dim))
    torch.testing.assert_close(
        model.freqs_cis,
        precompute_freqs_cis(args.head_dim, args.max_seq_len, args.rope_theta),
        atol=0,
        rtol=0,
    )


def test_without_depth_init_every_block_uses_the_same_std(build):
    model = build("debug", depth_init=False)
    std = 0.02 / (2 * model.args.n_layers) ** 0.5
    for layer in model.layers.values():
        assert layer.attention.wo.weight.std().item() == pytest.approx(std, rel=0.05)


def test_same_seed_same_weights_other_seed_other_weights(build):
    a, b, c = build(seed=7), build(seed=7), build(seed=8)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(pa, pb), name
        if "norm" not in name:
            assert not torch.equal(pa, pc), name


def test_default_seed_comes_from_torch_manual_seed(build):
    torch.manual_seed(3)
    a = build(seed=None)
    torch.manual_seed(3)
    b = build(seed=None)
    assert torch.equal(a.layers["0"].attention.wq.weight, b.layers["0"].attention.wq.weight)
    assert torch.equal(a.layers["0"].attention.wq.weight, build(seed=3).layers["0"].attention.wq.weight)


def test_pipeline_stage_draws_the_same_weights_as_the_whole_model(build):
    """Device-count independence: a stage holding only layer 1 initializes it as the full model does."""
    full = build("tiny", seed=5)
    stage = build("tiny", seed=5)  # re-initialized below after deleting modules
    del stage.layers["0"]
    stage.tok_embeddings = None
    with torch.no_grad():
        for p in stage.parameters():
            p.zero_()
    stage.init_weights(seed=5)
    full_params = dict(full.named_parameters())
    for name, param in stage.named_parameters():
        assert torch.equal(param, full_params[name]), name


def test_bf16_parameters_get_the_rounded_float32_draw(build):
    fp32 = build("tiny", seed=1)
    bf16 = build("tiny", seed=1)
    with torch.no_grad():
        for param in bf16.parameters():
            param.data = param.data.bfloat16()
    bf16.init_weights(seed=1)
    assert torch.equal(bf16.layers["1"].feed_forward.w2.weight, fp32.layers["1"].feed_forward.w2.weight.bfloat16())
