"""FlexAttention as the dry run models it: the fused kernel a CUDA run compiles, not the CPU's stand-ins.

A CUDA run of attention with sinks or a sliding window runs FlexAttention (decoder/attention_kernels.py's "auto"):
one fused kernel that keeps no score matrix -- it saves q, k, v, its output and the float32 log-sum-exp for the
backward -- and skips the blocks wholly outside the causal window. The simulation's tensors are on the CPU, where
"auto" would pick the eager fallback (a float32 score matrix per head, [seq, seq]: gigabytes a layer at 32k tokens)
and FlexAttention itself runs unfused. So, inside fake_runtime.fake_rank, the kernel is chosen as on CUDA and the
FlexAttention call is one opaque op whose fake implementation shapes the fused kernel's outputs; op_costs.py counts
its FLOPs over the keys each query sees. What the kernel does around the call (the sinks' rescaling through the
log-sum-exp) runs as the real ops, so its temporaries are traced as they are. Document masking is not modelled in
the cost (a packed batch's cross-document blocks, which the kernel also skips, are counted).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

import torch

from titan_models.decoder import attention_kernels

MODELLED_DEVICE = "cuda"


def _scores(q, k, window, causal, scale) -> torch.Tensor:
    positions = torch.arange(q.shape[-2], device=q.device)
    keep = attention_kernels.visible(positions[:, None], positions[None, :], None, None, causal, window)
    return (q.float() @ k.float().transpose(-1, -2) * scale).masked_fill(~keep, float("-inf"))


def _reference(q, k, v, window, causal, scale) -> tuple[torch.Tensor, torch.Tensor]:
    """What FlexAttention returns, computed plainly (real tensors, small: the tests compare the stand-in with the
    kernels it stands for): the output and the float32 log-sum-exp of each query's scores."""
    scores = _scores(q, k, window, causal, scale)
    lse = torch.logsumexp(scores, dim=-1)
    return (torch.exp(scores - lse.unsqueeze(-1)) @ v.float()).to(q.dtype), lse


@torch.library.custom_op("titan::flex_attention_stand_in", mutates_args=())
def _forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        return _reference(q, k, v, window, causal, scale)


@_forward.register_fake
def _(q, k, v, window, causal, scale):
    return torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("titan::flex_attention_stand_in_backward", mutates_args=())
def _backward_op(
    dout: torch.Tensor,
    dlse: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    window: int | None,
    causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # The flash backward (autograd does not run inside a custom op): P = exp(S - lse), dS = P (dP - D + dlse),
    # D = rowsum(dout * out); the lse's own gradient is the softmax itself.
    qf, kf, vf, dof = q.float(), k.float(), v.float(), dout.float()
    probs = torch.exp(_scores(q, k, window, causal, scale) - lse.unsqueeze(-1))
    rowsum = (dof * out.float()).sum(-1, keepdim=True)
    dscores = probs * (dof @ vf.transpose(-1, -2) - rowsum + dlse.unsqueeze(-1))
    dq, dk = dscores @ kf * scale, dscores.transpose(-1, -2) @ qf * scale
    return dq.to(q.dtype), dk.to(k.dtype), (probs.transpose(-1, -2) @ dof).to(v.dtype)


@_backward_op.register_fake
def _(dout, dlse, q, k, v, out, lse, window, causal, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, *ctx.args = inputs
    ctx.save_for_backward(q, k, v, *output)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dlse = torch.zeros_like(lse) if dlse is None else dlse
    return (*_backward_op(dout.contiguous(), dlse, q, k, v, out, lse, *ctx.args), None, None, None)


_forward.register_autograd(_backward, setup_context=_setup_context)


def flex_attention_stand_in(q, k, v, document_ids, positions, sinks, window, causal, scale) -> torch.Tensor:
    """attention_kernels.flex_attention_kernel with the FlexAttention call as one opaque op. Its cost and its
    reference computation take the sequence as one document in order (document_ids and positions are not read: on
    fake tensors they change no shape); the sinks' rescaling as that function does it, kept in step
    with it by a test (tests/test_dry_run_attention.py: equal to the eager kernel, outputs and gradients)."""
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"the stand-in expects equal head counts (Attention repeats K/V): {q.shape} vs {k.shape}")
    out, lse = _forward(q, k, v, window, causal, scale)
    if sinks is None:
        return out
    kept = torch.sigmoid(lse.float() - sinks.float().view(1, -1, 1))
    return (out.float() * kept.unsqueeze(-1)).to(out.dtype)


def _choose_as_on_cuda(original):
    def choose_kernel(requested, *, sinks, window, device_type, needs_grad):
        return original(requested, sinks=sinks, window=window, device_type=MODELLED_DEVICE, needs_grad=needs_grad)

    return choose_kernel


@contextlib.contextmanager
def attention_as_on_cuda() -> Iterator[None]:
    """Inside: attention with sinks or a window picks its kernel as a CUDA run would, and FlexAttention is the
    stand-in above. A forced "eager" stays eager (its score matrix is real on a GPU too)."""
    with (
        mock.patch.object(attention_kernels, "choose_kernel", _choose_as_on_cuda(attention_kernels.choose_kernel)),
        mock.patch.object(attention_kernels, "flex_attention_kernel", flex_attention_stand_in),
    ):
        yield
