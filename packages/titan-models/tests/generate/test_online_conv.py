"""The three online-convolution strategies agree with each other and with the FFT convolution, for random
filters and lengths that are and are not powers of two. Tolerances: float32 atol 1e-5, float64 atol 1e-10
(outputs are O(1): filters are scaled by 1/sqrt(L))."""

import pytest
import torch

from titan_models.generate import STRATEGIES, make_online_conv
from titan_models.hyena.filter import fft_causal_conv

TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-10}


def run_online(strategy: str, h: torch.Tensor, x: torch.Tensor, prompt: int, direct_max: int) -> torch.Tensor:
    """Outputs [B, C, L] of convolving x [B, C, L] with h, the first `prompt` positions prefilled (two channel
    groups, as two layers would), then one position at a time."""
    channels, length = h.shape
    conv = make_online_conv(strategy, h, x.shape[0], direct_max=direct_max)
    y = torch.zeros_like(x)
    if prompt:
        half = channels // 2
        y[:, :half, :prompt] = conv.prefill(x[:, :half, :prompt], slice(0, half))
        y[:, half:, :prompt] = conv.prefill(x[:, half:, :prompt], slice(half, channels))
    for t in range(prompt, length):
        y[:, :, t] = conv.pending(t) + h[:, 0] * x[:, :, t]
        conv.push(t, x[:, :, t])
    return y


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("length", [64, 256, 100, 333])
@pytest.mark.parametrize("prompt", [0, 7])
def test_flash_equals_lazy_and_eager(dtype, length, prompt):
    generator = torch.Generator().manual_seed(length + prompt)
    h = torch.randn(6, length, generator=generator, dtype=dtype) / length**0.5
    x = torch.randn(2, 6, length, generator=generator, dtype=dtype)
    outputs = {s: run_online(s, h, x, prompt, direct_max=16) for s in STRATEGIES}
    atol = TOLERANCE[dtype]
    torch.testing.assert_close(outputs["flash"], outputs["lazy"], atol=atol, rtol=0)
    torch.testing.assert_close(outputs["flash"], outputs["eager"], atol=atol, rtol=0)
    torch.testing.assert_close(outputs["flash"], fft_causal_conv(x, h), atol=atol, rtol=0)


@pytest.mark.parametrize("direct_max", [0, 1, 4, 1024], ids=["all_fft", "direct_1", "direct_4", "all_direct"])
def test_direct_and_fft_tiles_agree(direct_max):
    generator = torch.Generator().manual_seed(0)
    h = torch.randn(4, 150, generator=generator, dtype=torch.float64) / 150**0.5
    x = torch.randn(1, 4, 150, generator=generator, dtype=torch.float64)
    y = run_online("flash", h, x, prompt=3, direct_max=direct_max)
    torch.testing.assert_close(y, fft_causal_conv(x, h), atol=1e-10, rtol=0)


def test_unknown_strategy_lists_the_valid_ones():
    with pytest.raises(
        ValueError, match="strategy='fast' is not a long-convolution strategy; use one of lazy, eager, flash"
    ):
        make_online_conv("fast", torch.zeros(1, 4), 1)
