"""Attention over one (query block, key/value block) pair, returning the log-sum-exp ring attention merges
with, and its backward given the *merged* output and log-sum-exp.

Layout is SDPA's: q [B, H, Sq, D], k/v [B, Hkv, Sk, D] with Hkv dividing H (grouped-query attention: query
head h reads key/value head h // (H / Hkv)). lse is float32 [B, H, Sq]. A causal block is a diagonal one
(Sq == Sk, query i sees keys 0..i).

Backward from the merged values is exact: with the global lse, exp(s - lse) is this block's share of the
global softmax, and rowsum(dout * out) over the global output is the same for every block (FlashAttention-2's
D term), so the per-block gradients sum to the full ones.

`mask` (bool [B, Sq, Sk], True: may attend; document masking) is for the math kernel only, and may leave a
query row of a block with no key: its lse is then -inf and its output 0, which the merge weighs by 0.

Kernels: "cpu_flash" (`_scaled_dot_product_flash_attention_for_cpu`: fp32/bf16/fp16, grouped heads natively),
"cuda_flash" (`_scaled_dot_product_flash_attention`: bf16/fp16, heads repeated for it) and "math" (any
device and dtype, float32 inside, materializes one block's scores).
"""

from __future__ import annotations

import torch

KERNELS = ("auto", "fused", "math")
_aten = torch.ops.aten
_FUSED = {
    "cpu": ("cpu_flash", (torch.float32, torch.bfloat16, torch.float16)),
    "cuda": ("cuda_flash", (torch.bfloat16, torch.float16)),
}


def pick_kernel(q: torch.Tensor, kernel: str, value_dim: int | None = None) -> str:
    """The block kernel for q's device and dtype: "auto" takes the fused one when there is one, "fused"
    insists on it, "math" always uses the math path. The fused kernels need values as wide as queries
    (`value_dim`, default q's): multi-head latent attention's narrower values take the math path."""
    if kernel not in KERNELS:
        raise ValueError(f"ring attention kernel={kernel!r} is not one of {KERNELS}")
    if kernel == "math":
        return "math"
    name, dtypes = _FUSED.get(q.device.type, (None, ()))
    same_width = value_dim in (None, q.shape[-1])
    if name is not None and q.dtype in dtypes and same_width:
        return name
    if kernel == "fused" and not same_width:
        raise ValueError(
            f"ring attention kernel='fused' needs values as wide as queries ({value_dim} vs {q.shape[-1]}); use "
            "kernel='auto' or 'math'"
        )
    if kernel == "fused":
        known = "; ".join(f"{device}: {', '.join(str(d) for d in dtypes)}" for device, (_, dtypes) in _FUSED.items())
        raise ValueError(
            f"ring attention kernel='fused' has no fused kernel for {q.dtype} on {q.device.type} (fused kernels "
            f"exist for {known}); use kernel='auto' or 'math'"
        )
    return "math"


def block_forward(q, k, v, causal: bool, scale: float, kernel: str, mask=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [B, H, Sq, D] in q's dtype, lse float32 [B, H, Sq])."""
    if mask is not None and kernel != "math":
        raise ValueError(f"a masked attention block needs kernel='math', got {kernel!r}")
    if kernel == "cpu_flash":
        return _aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
    if kernel == "cuda_flash":
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out, lse, *_ = _aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, scale=scale)
        return out, lse
    scores = _scores(q, k, causal, scale, mask)
    lse = torch.logsumexp(scores, dim=-1)
    # A row with no key (masked) has lse -inf: subtract 0 there so its weights are exp(-inf) = 0, not NaN.
    finite_lse = lse.masked_fill(lse == float("-inf"), 0.0) if mask is not None else lse
    out = torch.matmul(torch.exp(scores - finite_lse.unsqueeze(-1)), v.float().unsqueeze(2))
    return _ungroup(out).to(q.dtype), _ungroup(lse)


def block_backward(dout, q, k, v, out, lse, causal: bool, scale: float, kernel: str, mask=None):
    """(dq, dk, dv) of this block's share, given the merged `out` and `lse` of q's rows."""
    if mask is not None and kernel != "math":
        raise ValueError(f"a masked attention block needs kernel='math', got {kernel!r}")
    if kernel == "cpu_flash":
        return _aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout, q, k, v, out, lse, 0.0, causal, scale=scale
        )
    if kernel == "cuda_flash":
        rep = q.shape[1] // k.shape[1]
        kr, vr = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        # None for the cumulative lengths selects the dense (not varlen) kernel; the philox seed and offset are
        # read only with dropout.
        dq, dk, dv = _aten._scaled_dot_product_flash_attention_backward(
            dout, q, kr, vr, out, lse, None, None, q.shape[2], k.shape[2], 0.0, causal, None, None, scale=scale
        )
        return dq, _sum_groups(dk, k), _sum_groups(dv, v)
    hkv = k.shape[1]
    scores = _scores(q, k, causal, scale, mask)
    probs = torch.exp(scores - _group(lse, hkv).unsqueeze(-1))  # [B, Hkv, rep, Sq, Sk]
    dout32 = _group(dout.float(), hkv)
    delta = (dout32 * _group(out.float(), hkv)).sum(-1, keepdim=True)
    dv = torch.matmul(probs.transpose(-1, -2), dout32).sum(2)
    dscores = probs * (torch.matmul(dout32, v.float().unsqueeze(2).transpose(-1, -2)) - delta)
    dq = torch.matmul(dscores, k.float().unsqueeze(2)) * scale
    dk = torch.matmul(dscores.transpose(-1, -2), _group(q.float(), hkv)).sum(2) * scale
    return _ungroup(dq).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _group(x: torch.Tensor, hkv: int) -> torch.Tensor:
    """[B, H, ...] -> [B, Hkv, H / Hkv, ...]: query heads next to the key/value head they read."""
    return x.unflatten(1, (hkv, x.shape[1] // hkv))


def _ungroup(x: torch.Tensor) -> torch.Tensor:
    return x.flatten(1, 2)


def _sum_groups(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return grad.unflatten(1, (like.shape[1], -1)).sum(2)


def _scores(q, k, causal: bool, scale: float, mask=None) -> torch.Tensor:
    """float32 scaled scores [B, Hkv, rep, Sq, Sk], -inf above the diagonal when causal and where `mask`
    is False."""
    scores = torch.matmul(_group(q.float(), k.shape[1]), k.float().unsqueeze(2).transpose(-1, -2)) * scale
    if causal:
        above = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(above, float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask[:, None, None], float("-inf"))
    return scores
