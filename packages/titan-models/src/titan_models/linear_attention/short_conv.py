"""The short causal depthwise convolution that mixes each channel of q, k and v over the last few tokens before the
delta rule (kernel 4 in Qwen3-Next), for a whole sequence and for one decoding step.

weight [C, K] holds channel c's taps oldest first, as nn.Conv1d(groups=C).weight[:, 0] does: token t's output is
sum_i weight[c, i] * x[t - (K - 1) + i, c]. With packed documents a tap that would reach into an earlier document
reads zero instead, exactly what the document alone would see at its start (zero padding).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from titan_models.linear_attention.documents import document_runs


def causal_depthwise_conv1d(
    x: torch.Tensor, weight: torch.Tensor, document_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """x [B, S, C], weight [C, K] -> [B, S, C]; document_ids [B, S] keeps each window inside its document."""
    seq_len, taps = x.shape[1], weight.shape[1]
    if document_ids is None:
        out = F.conv1d(x.transpose(1, 2), weight[:, None, :], padding=taps - 1, groups=x.shape[2])
        return out[..., :seq_len].transpose(1, 2)
    runs = document_runs(document_ids)
    padded = F.pad(x, (0, 0, taps - 1, 0))
    # -1 marks the zero padding before token 0: no run has that number.
    padded_runs = F.pad(runs, (taps - 1, 0), value=-1)
    out = torch.zeros_like(x)
    for i in range(taps):  # tap i reads token t - (K - 1) + i
        same_document = (padded_runs[:, i : i + seq_len] == runs)[..., None]
        out = out + weight[:, i] * padded[:, i : i + seq_len] * same_document
    return out


class CausalDepthwiseConv1d(nn.Module):
    """`causal_depthwise_conv1d` as a parameter-free module (the weight stays the layer's HF-named conv1d): the seam
    where titan_parallel's context parallelism, recognizing `cp_style`, feeds each sequence piece the K - 1 inputs
    before it from the rank that holds them."""

    cp_style = "causal_conv"

    def forward(self, x: torch.Tensor, weight: torch.Tensor, document_ids: torch.Tensor | None = None) -> torch.Tensor:
        return causal_depthwise_conv1d(x, weight, document_ids)


def causal_depthwise_conv1d_step(
    x_t: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: x_t [B, C] and conv_state [B, C, K - 1], the previous K - 1 inputs oldest first (zeros before
    the sequence began) -> (output [B, C], the state including x_t)."""
    window = torch.cat([conv_state, x_t[..., None]], dim=-1)
    return (window * weight).sum(-1), window[..., 1:]


def conv_state_after(x: torch.Tensor, taps: int) -> torch.Tensor:
    """The conv_state [B, C, K - 1] that continues a sequence x [B, S, C]: its last K - 1 inputs, zero-padded in
    front when S < K - 1."""
    return F.pad(x.transpose(1, 2), (taps - 1, 0))[..., x.shape[1] :]
