"""Rotary position embedding (Su et al., RoFormer) in Meta's layout.

Meta's Llama code treats each head vector as head_dim / 2 complex numbers made of *adjacent* pairs
(x0 + i x1, x2 + i x3, ...) and rotates pair k at position p by p * theta_k. Hugging Face instead pairs
element k with element k + head_dim / 2 ("rotate_half"); the Hugging Face adapters (titan_models.decoder.hf)
permute the rows of wq and wk so both layouts compute the same function. The frequency scalings (Llama 3.1's,
YaRN's) are data the decoder's args carry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1 RoPE frequency scaling ("llama3" rope_type in Hugging Face).

    Long wavelengths are stretched by `factor`, short ones kept, and the band in between interpolated,
    so a model pre-trained at `original_max_position_embeddings` tokens extends to longer contexts.
    """

    factor: float = 8.0
    """How much the low frequencies (long wavelengths) are divided by."""
    low_freq_factor: float = 1.0
    """Wavelengths longer than original_max_position_embeddings / low_freq_factor are fully scaled."""
    high_freq_factor: float = 4.0
    """Wavelengths shorter than original_max_position_embeddings / high_freq_factor are left unchanged."""
    original_max_position_embeddings: int = 8192
    """Context length the unscaled model was trained at."""


@dataclass(frozen=True)
class YarnScaling:
    """YaRN RoPE scaling (Peng et al., "YaRN"; "yarn" rope_type in Hugging Face), as DeepSeek-V3 uses it.

    Frequencies that turn fewer than `beta_slow` times over the original context are divided by `factor`,
    those turning more than `beta_fast` times kept, with a linear ramp between. The rotated parts are scaled
    by mscale(factor, mscale) / mscale(factor, mscale_all_dim) (or mscale(factor) when either is 0), and the
    attention softmax scale by mscale(factor, mscale_all_dim) ** 2, where mscale(s, m) = 0.1 m ln(s) + 1."""

    factor: float = 40.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 1.0
    truncate: bool = True
    """Round the ramp's ends to whole pair indices (Hugging Face's default); GPT-OSS's config sets it false."""


def scale_frequencies(freqs: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """Llama 3.1 frequency scaling, a vectorized copy of `apply_scaling` in Meta's reference model."""
    low_freq_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_freq_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    wavelen = 2 * math.pi / freqs
    smooth = (scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    interpolated = (1 - smooth) * freqs / scaling.factor + smooth * freqs
    scaled = torch.where(wavelen > low_freq_wavelen, freqs / scaling.factor, interpolated)
    return torch.where(wavelen < high_freq_wavelen, freqs, scaled)


def _mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_frequencies(freqs: torch.Tensor, head_dim: int, theta: float, scaling: YarnScaling) -> torch.Tensor:
    """YaRN's blend of the original frequencies and those divided by `factor`, as Hugging Face computes it
    (`_compute_yarn_parameters`, its ramp's ends truncated or not as `scaling.truncate` says)."""

    def turning_dim(rotations: float) -> float:  # the pair index that turns `rotations` times over the context
        context = scaling.original_max_position_embeddings
        return head_dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = turning_dim(scaling.beta_fast), turning_dim(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32, device=freqs.device) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1 where a pair keeps its frequency (fast), 0 where it is interpolated (slow)
    return freqs / scaling.factor * (1 - keep) + freqs * keep


def rotation_magnitude(scaling: RopeScaling | YarnScaling | None) -> float:
    """How much RoPE scales what it rotates: 1, except under YaRN (its attention factor)."""
    if not isinstance(scaling, YarnScaling):
        return 1.0
    if scaling.mscale and scaling.mscale_all_dim:
        return _mscale(scaling.factor, scaling.mscale) / _mscale(scaling.factor, scaling.mscale_all_dim)
    return _mscale(scaling.factor)


def softmax_scale_factor(scaling: RopeScaling | YarnScaling | None) -> float:
    """What multiplies the attention's 1 / sqrt(head_dim): 1, except under YaRN with mscale_all_dim."""
    if not isinstance(scaling, YarnScaling) or not scaling.mscale_all_dim:
        return 1.0
    return _mscale(scaling.factor, scaling.mscale_all_dim) ** 2


def precompute_freqs_cis(
    head_dim: int,
    end: int,
    theta: float,
    scaling: RopeScaling | YarnScaling | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Complex numbers m * exp(i * p * theta_k), shape [end, head_dim // 2], complex64; m = 1 but under YaRN.

    Computed in float32 whatever the default dtype: bf16 angles at large positions are badly wrong.
    """
    exponents = torch.arange(0, head_dim, 2, device=device)[: head_dim // 2].float() / head_dim
    freqs = 1.0 / (theta**exponents)
    if isinstance(scaling, YarnScaling):
        freqs = yarn_frequencies(freqs, head_dim, theta, scaling)
    elif scaling is not None:
        freqs = scale_frequencies(freqs, scaling)
    positions = torch.arange(end, device=device, dtype=torch.float32)
    angles = torch.outer(positions, freqs)
    return torch.polar(torch.full_like(angles, rotation_magnitude(scaling)), angles)


def _broadcastable(freqs_cis: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Shape freqs_cis to multiply x viewed as complex [bs, seqlen, heads, head_dim // 2].

    freqs_cis is either the whole table [max_seq_len, head_dim // 2] (positions 0..seqlen-1 are used), or
    per-position rows already gathered: [seqlen, head_dim // 2] or [bs, seqlen, head_dim // 2].
    """
    bs, seqlen, _, half = x.shape
    if freqs_cis.ndim == 2:
        if freqs_cis.shape[0] < seqlen:
            raise ValueError(
                f"sequence length {seqlen} exceeds the RoPE table length {freqs_cis.shape[0]} "
                f"(Llama3Args.max_seq_len); raise max_seq_len"
            )
        return freqs_cis[:seqlen].view(1, seqlen, 1, half)
    if freqs_cis.ndim == 3:
        return freqs_cis.view(freqs_cis.shape[0], seqlen, 1, half)
    raise ValueError(f"freqs_cis must have 2 or 3 dims, got shape {tuple(freqs_cis.shape)}")


def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries and keys [bs, seqlen, heads, head_dim] by their positions' angles.

    xq and xk may have different head counts (grouped-query attention). The rotation runs in float32 and
    the result is cast back to the input dtype.
    """
    xq_complex = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_complex = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    rotation = _broadcastable(freqs_cis, xq_complex)
    xq_out = torch.view_as_real(xq_complex * rotation).flatten(3)
    xk_out = torch.view_as_real(xk_complex * rotation).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)
