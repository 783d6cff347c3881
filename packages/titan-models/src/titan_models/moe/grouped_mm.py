"""Each expert's rows times its own weight, in one call: torch's grouped matmul where it applies, an equal
per-expert loop where it does not.

Rows arrive sorted by expert; `offsets[e]` is where expert e's rows end (a cumulative sum of the counts),
so an expert with no rows has an empty group.
"""

from __future__ import annotations

import torch


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the incoming gradient contiguous: torch._grouped_mm's backward refuses
    expanded gradients (e.g. that of a .sum()), whose strides are 0."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def grouped_mm_supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether torch._grouped_mm can take these operands: every stride a multiple of 16 bytes, a dtype it
    implements on this device (CPU: float32 and bfloat16; CUDA: bfloat16 from compute capability 9.0)."""
    if not hasattr(torch, "_grouped_mm") or x.dtype != weight.dtype:
        return False
    if x.device.type == "cuda":
        if x.dtype != torch.bfloat16 or torch.cuda.get_device_capability(x.device) < (9, 0):
            return False
    elif x.device.type != "cpu" or x.dtype not in (torch.float32, torch.bfloat16):
        return False
    aligned = 16 // x.element_size()
    return x.shape[-1] % aligned == 0 and weight.shape[-1] % aligned == 0


def grouped_mm_loop(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The same product one expert at a time (any dtype, device or shape). Reads the offsets on the host."""
    ends = offsets.tolist()
    starts = [0, *ends[:-1]]
    outputs = [x[start:end] @ weight[e] for e, (start, end) in enumerate(zip(starts, ends, strict=True))]
    return torch.cat(outputs) if outputs else x.new_zeros(0, weight.shape[-1])


def grouped_mm(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """x [rows, in] sorted by expert, weight [experts, in, out], offsets [experts] int32 -> [rows, out]."""
    if grouped_mm_supported(x, weight):
        return _ContiguousGrad.apply(torch._grouped_mm(x, weight, offs=offsets))
    return grouped_mm_loop(x, weight, offsets)
