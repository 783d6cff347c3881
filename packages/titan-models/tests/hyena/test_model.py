"""The Hyena LM and its operator: shapes, causality, the FFT convolution, channel layout, init, stages."""

import pytest
import torch
import torch.nn.functional as F

from titan_models.hyena import HyenaLM, hyena_plan
from titan_models.hyena.filter import fft_causal_conv


def test_param_count_matches_the_formula(build):
    from titan_models.hyena import count_params

    for flavor in ("tiny", "debug"):
        model = build(flavor)
        embedding = model.tok_embeddings.weight.numel()
        assert sum(p.numel() for p in model.parameters()) - embedding == count_params(model.args)


def test_fft_causal_conv_is_the_direct_sum():
    torch.manual_seed(0)
    x, h = torch.randn(2, 3, 37, dtype=torch.float64), torch.randn(3, 50, dtype=torch.float64)
    expected = torch.zeros_like(x)
    for t in range(37):
        expected[..., t] = (x[..., : t + 1] * h[:, : t + 1].flip(-1)).sum(-1)
    torch.testing.assert_close(fft_causal_conv(x, h), expected, atol=1e-12, rtol=0)


def test_forward_shape_and_causality(build):
    model = build("tiny")
    tokens = torch.randint(0, 2048, (2, 40), generator=torch.Generator().manual_seed(0))
    changed = tokens.clone()
    changed[:, 25:] = (changed[:, 25:] + 1) % 2048
    with torch.no_grad():
        logits, logits_changed = model(tokens), model(changed)
    assert logits.shape == (2, 40, 2048)
    torch.testing.assert_close(logits[:, :25], logits_changed[:, :25], atol=1e-5, rtol=0)  # FFT rounding only
    assert not torch.allclose(logits[:, 25:], logits_changed[:, 25:])


def test_filter_depends_on_the_lag_only(build):
    """Same h at a lag whatever the sequence length: what lets generation reuse training's filters."""
    filt = build("tiny").layers["0"].mixer.filter
    with torch.no_grad():
        torch.testing.assert_close(filt(40), filt(700)[:, :40], atol=1e-6, rtol=0)


def test_channel_slice_computes_the_same_channels(build):
    """The channel-major layout: the operator restricted to a contiguous block of channels (what a
    tensor-parallel rank holds) gives exactly those channels of the full operator's pre-projection output."""
    op = build("tiny").layers["0"].mixer
    x = torch.randn(2, 30, 64, generator=torch.Generator().manual_seed(1))
    captured = {}
    op.out_proj.register_forward_hook(lambda module, args, out: captured.update(y=args[0]))
    with torch.no_grad():
        op(x)
        full = captured["y"]
        dim, n = 64, op.order
        lo, hi = 32, 64  # the second of 2 shards
        op.in_proj.weight.data = op.in_proj.weight[lo * (n + 1) : hi * (n + 1)].clone()
        op.short_filter.weight.data = op.short_filter.weight[lo * (n + 1) : hi * (n + 1)].clone()
        op.short_filter.bias.data = op.short_filter.bias[lo * (n + 1) : hi * (n + 1)].clone()
        op.filter.out.weight.data = op.filter.out.weight[lo * (n - 1) : hi * (n - 1)].clone()
        op.filter.skip.data = op.filter.skip[lo * (n - 1) : hi * (n - 1)].clone()
        op.filter.decay_rates = op.filter.decay_rates[lo * (n - 1) : hi * (n - 1)].clone()
        op.out_proj.weight.data = op.out_proj.weight[:, lo:hi].clone()
        op(x)
    assert dim == op.in_proj.weight.shape[1]
    torch.testing.assert_close(captured["y"], full[..., lo:hi], atol=1e-6, rtol=0)


def test_order_3_runs_and_is_causal(build):
    model = build("tiny", order=3)
    tokens = torch.randint(0, 2048, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = model(tokens), model(torch.cat([tokens[:, :10], tokens[:, 10:].flip(1)], dim=1))
    torch.testing.assert_close(a[:, :10], b[:, :10], atol=1e-5, rtol=0)


def test_init_is_seeded_and_statistics_are_as_documented(build):
    a, b, c = build(seed=7), build(seed=7), build(seed=8)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(pa, pb), name
        if not any(constant in name for constant in ("norm", "freqs", "short_filter.bias")):
            assert not torch.equal(pa, pc), name
    op = build("debug").layers["0"].mixer
    assert op.in_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert torch.equal(op.filter.freqs, torch.ones_like(op.filter.freqs))
    rates = op.filter.decay_rates
    assert rates[0].item() == pytest.approx(4.6052 / 1.5, rel=1e-4) and rates[-1].item() == pytest.approx(
        4.6052 / 0.3, rel=1e-4
    )


def test_pipeline_stage_draws_the_same_weights_and_passes_hidden_states(build):
    full = build("tiny", seed=5)
    stage = build("tiny", seed=5)
    del stage.layers["0"]
    stage.tok_embeddings = None
    with torch.no_grad():
        for p in stage.parameters():
            p.zero_()
    stage.init_weights(seed=5)
    full_params = dict(full.named_parameters())
    for name, param in stage.named_parameters():
        assert torch.equal(param, full_params[name]), name
    first = build("tiny", seed=5)
    del first.layers["1"]
    first.norm = first.output = None
    tokens = torch.randint(0, 2048, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(stage(first(tokens)), full(tokens), atol=1e-5, rtol=0)


def test_bfloat16_autocast_trains(build):
    model = build("tiny")
    tokens = torch.randint(0, 2048, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(tokens)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_positions_of_the_whole_sequence_are_accepted_a_slice_is_refused(build):
    model = build("tiny")
    tokens = torch.randint(0, 2048, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(tokens), model(tokens, positions=torch.arange(8)))
        assert torch.equal(model(tokens), model(tokens, positions=torch.arange(8).expand(2, 8)))
        with pytest.raises(ValueError, match="context parallelism is not supported"):
            model(tokens, positions=torch.tensor([0, 1, 6, 7, 8, 9, 14, 15]))
    assert not hyena_plan(model.args).context_parallel


def test_built_on_meta_without_storage():
    from titan_models.hyena import FLAVORS

    with torch.device("meta"):
        model = HyenaLM(FLAVORS["125M"])
    model.init_weights(seed=0)  # a no-op on meta, as on a pipeline stage before to_empty
    assert all(p.device.type == "meta" for p in model.parameters())


def test_filter_reach_scales_with_filter_len(build):
    """The decay window reaches 1% at lag decay_slow * filter_len (HyenaOperator's docstring): debug's filters
    (filter_len 2048) are gone by 10k lags, debug_long's (65536) are still long at 64k."""

    def tail_over_peak(flavor: str, length: int) -> float:
        """For the longest-reaching channel: |h| at the last lag over its largest |h|."""
        with torch.no_grad():
            h = build(flavor).layers["0"].mixer.filter(length).abs()
        return float((h[:, -1] / h.max(dim=1).values).max())

    assert tail_over_peak("debug", 10240) < 1e-5
    assert tail_over_peak("debug_long", 65536) > 1e-3
