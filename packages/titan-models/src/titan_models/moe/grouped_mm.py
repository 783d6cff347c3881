"""Each expert's rows times its own weight, in one call: torch's grouped matmul where it applies, an equal
per-expert loop where it does not.

Rows arrive sorted by expert; `offsets[e]` is where expert e's rows end (a cumulative sum of the counts),
so an expert with no rows has an empty group.

It is one custom op (`titan::grouped_mm`) with its own backward: torch.compile sees an opaque call of known
output shape, so neither the loop's data-dependent slices nor torch._grouped_mm's compile-time checks (its
fake kernel accepts bfloat16 only, while the CPU kernel computes float32 too) break a compiled block.
"""

from __future__ import annotations

import torch


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
    return all(size % aligned == 0 for size in (x.shape[-1], *weight.shape[-2:]))


def _groups(offsets: torch.Tensor) -> list[tuple[int, int]]:
    ends = offsets.tolist()
    return list(zip([0, *ends[:-1]], ends, strict=True))


def grouped_mm_loop(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The same product one expert at a time (any dtype, device or shape). Reads the offsets on the host."""
    outputs = [x[start:end] @ weight[e] for e, (start, end) in enumerate(_groups(offsets))]
    return torch.cat(outputs) if outputs else x.new_zeros(0, weight.shape[-1])


def _forward(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    if grouped_mm_supported(x, weight):
        return torch._grouped_mm(x, weight, offs=offsets)
    return grouped_mm_loop(x, weight, offsets)


def _weight_grad(x: torch.Tensor, grad: torch.Tensor, offsets: torch.Tensor, experts: int) -> torch.Tensor:
    """[experts, in, out]: each expert's rows of x, transposed, times the same rows of grad (zero if none)."""
    if grouped_mm_supported(x, grad[None]):
        return torch._grouped_mm(x.t(), grad, offs=offsets)
    out = x.new_zeros(experts, x.shape[1], grad.shape[1])
    for e, (start, end) in enumerate(_groups(offsets)):
        out[e] = x[start:end].t() @ grad[start:end]
    return out


@torch.library.custom_op("titan::grouped_mm", mutates_args=())
def _grouped_mm_op(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return _forward(x, weight, offsets)


@_grouped_mm_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[-1])


@torch.library.custom_op("titan::grouped_mm_backward", mutates_args=())
def _grouped_mm_backward_op(
    grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    # Contiguous: torch._grouped_mm refuses a gradient with 0 strides (e.g. that of a .sum()).
    grad = grad.contiguous()
    grad_x = _forward(grad, weight.transpose(-2, -1), offsets)
    return grad_x, _weight_grad(x, grad, offsets, weight.shape[0])


@_grouped_mm_backward_op.register_fake
def _(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor):
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


def _setup_context(ctx, inputs, output) -> None:
    x, weight, offsets = inputs
    ctx.save_for_backward(x, weight, offsets)


def _backward(ctx, grad: torch.Tensor):
    x, weight, offsets = ctx.saved_tensors
    grad_x, grad_weight = _grouped_mm_backward_op(grad, x, weight, offsets)
    return grad_x, grad_weight, None


_grouped_mm_op.register_autograd(_backward, setup_context=_setup_context)


def grouped_mm(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """x [rows, in] sorted by expert, weight [experts, in, out], offsets [experts] int32 -> [rows, out]."""
    return _grouped_mm_op(x, weight, offsets)
