"""RoPE against a direct complex-number reference: pair k at position p rotated by p * freq_k."""

import cmath
import math

import pytest
import torch

from titan_models.decoder.rope import apply_rotary_emb, precompute_freqs_cis
from titan_models.llama3 import RopeScaling


def reference_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> list[float]:
    """Meta's precompute_freqs_cis + apply_scaling (llama-models, Llama 3.1), as plain Python loops."""
    freqs = [1.0 / theta ** (2 * k / head_dim) for k in range(head_dim // 2)]
    if scaling is None:
        return freqs
    low_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    scaled = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            scaled.append(freq)
        elif wavelen > low_wavelen:
            scaled.append(freq / scaling.factor)
        else:
            smooth = (scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor) / (
                scaling.high_freq_factor - scaling.low_freq_factor
            )
            scaled.append((1 - smooth) * freq / scaling.factor + smooth * freq)
    return scaled


def reference_rotate(x: torch.Tensor, positions: list[int], freqs: list[float]) -> torch.Tensor:
    """x: [seqlen, heads, head_dim]; adjacent elements (2k, 2k+1) form complex number k."""
    out = torch.empty_like(x, dtype=torch.float64)
    for s, pos in enumerate(positions):
        for h in range(x.shape[1]):
            for k, freq in enumerate(freqs):
                z = complex(x[s, h, 2 * k].item(), x[s, h, 2 * k + 1].item()) * cmath.exp(1j * pos * freq)
                out[s, h, 2 * k], out[s, h, 2 * k + 1] = z.real, z.imag
    return out


# head_dim 8 with theta 500000 gives wavelengths 6.3, 167, 4443 and 118000 tokens: with the default
# scaling (8192 original context) one each unchanged, two interpolated-or-scaled bands all exercised.
@pytest.mark.parametrize("scaling", [None, RopeScaling()], ids=["plain", "llama3.1-scaled"])
def test_rotation_matches_complex_reference(scaling):
    head_dim, theta, seqlen = 8, 500000.0, 6
    torch.manual_seed(0)
    xq = torch.randn(1, seqlen, 3, head_dim)
    xk = torch.randn(1, seqlen, 1, head_dim)
    table = precompute_freqs_cis(head_dim, 16, theta, scaling)
    out_q, out_k = apply_rotary_emb(xq, xk, table)

    freqs = reference_frequencies(head_dim, theta, scaling)
    positions = list(range(seqlen))
    torch.testing.assert_close(out_q[0].double(), reference_rotate(xq[0], positions, freqs), atol=1e-5, rtol=0)
    torch.testing.assert_close(out_k[0].double(), reference_rotate(xk[0], positions, freqs), atol=1e-5, rtol=0)


def test_scaling_changes_only_long_wavelengths():
    plain = precompute_freqs_cis(8, 2, 500000.0).angle()[1]
    scaled = precompute_freqs_cis(8, 2, 500000.0, RopeScaling()).angle()[1]
    assert torch.equal(plain[0], scaled[0])  # wavelength 6.3 < 8192 / 4: untouched
    assert torch.allclose(scaled[3], plain[3] / 8)  # wavelength 118000 > 8192: divided by factor


def test_gathered_positions_equal_slicing_the_full_sequence():
    """A rank holding tokens 5..9 of a sequence (context parallelism) rotates them as the full run does."""
    torch.manual_seed(0)
    head_dim = 8
    xq, xk = torch.randn(2, 12, 2, head_dim), torch.randn(2, 12, 1, head_dim)
    table = precompute_freqs_cis(head_dim, 32, 10000.0, RopeScaling(original_max_position_embeddings=64))
    full_q, full_k = apply_rotary_emb(xq, xk, table)

    positions = torch.arange(5, 10)
    part_q, part_k = apply_rotary_emb(xq[:, 5:10], xk[:, 5:10], table[positions])
    torch.testing.assert_close(part_q, full_q[:, 5:10], atol=1e-6, rtol=0)
    torch.testing.assert_close(part_k, full_k[:, 5:10], atol=1e-6, rtol=0)

    # Per-sample positions: row 0 holds tokens 0..3, row 1 tokens 7..10.
    batched = torch.stack([torch.arange(0, 4), torch.arange(7, 11)])
    rows_q, _ = apply_rotary_emb(torch.stack([xq[0, 0:4], xq[1, 7:11]]), xk[:, :4], table[batched])
    torch.testing.assert_close(rows_q[0], full_q[0, 0:4], atol=1e-6, rtol=0)
    torch.testing.assert_close(rows_q[1], full_q[1, 7:11], atol=1e-6, rtol=0)


def test_sequence_longer_than_table_is_rejected():
    table = precompute_freqs_cis(8, 4, 10000.0)
    x = torch.randn(1, 5, 1, 8)
    with pytest.raises(ValueError, match="max_seq_len"):
        apply_rotary_emb(x, x, table)


def test_bf16_inputs_keep_their_dtype():
    table = precompute_freqs_cis(8, 4, 10000.0)
    x = torch.randn(1, 4, 2, 8, dtype=torch.bfloat16)
    out_q, out_k = apply_rotary_emb(x, x, table)
    assert out_q.dtype == out_k.dtype == torch.bfloat16
