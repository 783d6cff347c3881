"""Parity with transformers' Qwen3-Next reference in float32: our chunked and recurrent rules against
torch_chunk_gated_delta_rule / torch_recurrent_gated_delta_rule (atol 1e-5), and our GatedDeltaNet, loaded by name
with the state_dict of a tiny Qwen3NextGatedDeltaNet, against it: outputs, input and parameter gradients within
2e-5 of the reference's largest entry. Weights are drawn away from their initial values (norm weight and log A
over [0.5, 1.5], dt_bias random) so a misplaced gate or a swapped slice of the interleaved projection shows."""

import pytest
import torch
import transformers  # the reference, titan-models' test extra: missing, this module fails, never skips
from transformers.models.qwen3_next import modeling_qwen3_next as hf

from titan_models.linear_attention import (
    GatedDeltaNet,
    GatedDeltaNetArgs,
    chunk_gated_delta_rule,
    recurrent_gated_delta_rule,
)

TOL = dict(atol=1e-5, rtol=1e-5)  # the rule's outputs and states are O(1)


@pytest.mark.parametrize("seq_len", [50, 130])
@pytest.mark.parametrize("l2norm", [False, True])
def test_rules_equal_transformers(rule_inputs, seq_len, l2norm):
    inputs, state = rule_inputs(seq_len)
    if not l2norm:
        inputs = (inputs[0] / 4, inputs[1] / 4, *inputs[2:])
    reference = dict(initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=l2norm)
    ours = dict(initial_state=state, use_qk_l2norm=l2norm)
    for theirs_rule, our_rule in ((hf.torch_chunk_gated_delta_rule, chunk_gated_delta_rule),
                                  (hf.torch_recurrent_gated_delta_rule, recurrent_gated_delta_rule)):  # fmt: skip
        their_out, their_final = theirs_rule(*inputs, **reference)
        out, final = our_rule(*inputs, **ours)
        torch.testing.assert_close(out, their_out, **TOL)
        torch.testing.assert_close(final, their_final, **TOL)


SHAPES = {
    # Two value heads per key head (Qwen3-Next's grouping), unequal key and value widths.
    "grouped": dict(hidden_size=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                    linear_value_head_dim=6, linear_conv_kernel_dim=4),
    "one_to_one_kernel_3": dict(hidden_size=24, linear_num_key_heads=3, linear_num_value_heads=3,
                                linear_key_head_dim=4, linear_value_head_dim=8, linear_conv_kernel_dim=3),
}  # fmt: skip


def layer_pair(shape: str) -> tuple[torch.nn.Module, GatedDeltaNet]:
    config = transformers.Qwen3NextConfig(
        **SHAPES[shape], rms_norm_eps=1e-5, num_hidden_layers=1, layer_types=["linear_attention"],
        num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    torch.manual_seed(0)
    theirs = hf.Qwen3NextGatedDeltaNet(config, layer_idx=0)
    with torch.no_grad():
        for name, param in theirs.named_parameters():
            if name in ("norm.weight", "A_log"):
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(std=0.3)
    args = GatedDeltaNetArgs(
        dim=config.hidden_size, n_key_heads=config.linear_num_key_heads, n_value_heads=config.linear_num_value_heads,
        key_head_dim=config.linear_key_head_dim, value_head_dim=config.linear_value_head_dim,
        conv_kernel_size=config.linear_conv_kernel_dim, norm_eps=config.rms_norm_eps, chunk_size=16,
    )  # fmt: skip
    ours = GatedDeltaNet(args)
    ours.load_state_dict(theirs.state_dict(), strict=True)  # by name: HF's linear_attn.* keys are ours
    return theirs, ours


def assert_close_to_scale(actual, expected, rel=2e-5, msg=None):
    """Equal up to float32 rounding: within rel times the reference's largest entry (two correct float32
    implementations that sum in different orders differ by ~1e-6 of the scale)."""
    torch.testing.assert_close(actual, expected, atol=rel * expected.abs().max().item(), rtol=0, msg=msg)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_layer_equals_transformers(shape):
    theirs, ours = layer_pair(shape)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 45, theirs.hidden_size, generator=gen)
    cotangent = torch.randn(2, 45, theirs.hidden_size, generator=gen)
    outputs, grads = [], []
    for layer in (theirs, ours):
        leaf = x.clone().requires_grad_()
        out = layer(leaf)
        (out * cotangent).sum().backward()
        outputs.append(out.detach())
        grads.append(leaf.grad)
    assert_close_to_scale(outputs[1], outputs[0])
    assert_close_to_scale(grads[1], grads[0])
    for (name, param), (their_name, their_param) in zip(sorted(ours.named_parameters()),
                                                        sorted(theirs.named_parameters()), strict=True):  # fmt: skip
        assert name == their_name
        assert_close_to_scale(param.grad, their_param.grad, msg=name)
