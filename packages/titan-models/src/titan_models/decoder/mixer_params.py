"""Parameter counts of the token mixers flops.py does not spell out itself: Qwen3-Next's Gated DeltaNet (kept here so
the shared counting in flops.py needs one line for it)."""

from __future__ import annotations

from titan_models.linear_attention.args import GatedDeltaNetArgs


def gated_deltanet_params(args: GatedDeltaNetArgs) -> int:
    """Parameters of GatedDeltaNet(args): in_proj_qkvz, in_proj_ba, the depthwise conv1d, A_log and dt_bias per value
    head, the output norm's weight, out_proj."""
    projections = args.dim * (2 * args.key_dim + 2 * args.value_dim) + args.dim * 2 * args.n_value_heads
    conv = args.conv_dim * args.conv_kernel_size
    return projections + conv + 2 * args.n_value_heads + args.value_head_dim + args.value_dim * args.dim
