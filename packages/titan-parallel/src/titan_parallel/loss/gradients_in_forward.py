"""Output projection + cross entropy with its gradients computed in the forward pass, chunk by chunk.

The loss is the model's last operation, so the gradient that will reach it in backward is a scalar: the
gradients of the summed loss with respect to the hidden states, the head's weight and bias can be computed
as soon as a chunk's softmax exists, and backward only multiplies them by that scalar (Liger Kernel's fused
linear cross entropy). Per chunk of tokens: the logits (one matmul), their float32 softmax, the gradient of
the logits (softmax minus the one-hot label, zero on ignored rows), then the hidden states' gradient and the
weight's (two matmuls), the logits freed before the next chunk. Three vocabulary-sized matmuls per token, as
the plain loss has, and nothing vocabulary-sized kept for backward but the weight's float32 gradient.

The head may be vocabulary-sharded (tensor parallelism: each rank holds a slice of the vocabulary): the
softmax's max and sum and the label's logit are then all-reduced over the shard group, each rank's gradient
of the hidden states is its slice's partial sum, and its weight gradient is exactly its slice's.

Differentiable once (`once_differentiable`): a double backward (create_graph) needs the recompute path
(chunked_loss.py, `gradients="recompute"`).
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

IGNORE_INDEX = -100
"""Labels equal to this add nothing to the loss (F.cross_entropy's default)."""


def linear_cross_entropy_sum(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    chunk_tokens: int,
    vocab_start: int = 0,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """The summed cross entropy of `F.linear(hidden, weight, bias)` (float32) against `labels`, ignored labels
    adding nothing. hidden: [tokens, dim]; weight: [vocab here, dim], rows `vocab_start`.. of the vocabulary
    (`group`: the ranks holding the other rows; None: all of it here); labels: [tokens]. Plain tensors.
    Where autograd records, gradients are computed now and scaled in backward; elsewhere only the loss."""
    needs = [torch.is_grad_enabled() and t is not None and t.requires_grad for t in (hidden, weight, bias)]
    if not any(needs):
        return _chunk_sums(hidden, weight, bias, labels, chunk_tokens, vocab_start, group, needs)[0]
    return _LinearCrossEntropy.apply(hidden, weight, bias, labels, chunk_tokens, vocab_start, group, needs)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, chunk_tokens, vocab_start, group, needs):
        loss, *grads = _chunk_sums(hidden, weight, bias, labels, chunk_tokens, vocab_start, group, needs)
        ctx.dtypes = [t.dtype if t is not None else None for t in (hidden, weight, bias)]
        ctx.save_for_backward(*grads)
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss):
        first = getattr(ctx, "scaled", None)
        if first is None:
            scaled = []
            for grad, dtype in zip(ctx.saved_tensors, ctx.dtypes, strict=True):
                # The saved gradients are this Function's own: scaled in place, no second copy.
                scaled.append(grad.mul_(grad_loss).to(dtype) if grad is not None else None)
            ctx.scaled, ctx.grad_loss = scaled, grad_loss
            return (*scaled, None, None, None, None, None)
        # Run again on a retained graph: a zero-bubble pipeline schedule's weight pass re-runs this node for the
        # head's weight after its input pass ran it for the hidden states. The saved gradients were scaled in
        # place by the first run: rescale what it returned.
        ratio = grad_loss / ctx.grad_loss
        return (*(g * ratio.to(g.dtype) if g is not None else None for g in first), None, None, None, None, None)


def _chunk_sums(hidden, weight, bias, labels, chunk_tokens, vocab_start, group, needs):
    """(summed loss, d loss / d hidden, d loss / d weight (float32), d loss / d bias (float32)); a gradient is
    None where `needs` says it is not wanted."""
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens={chunk_tokens} must be positive")
    need_hidden, need_weight, need_bias = needs
    grad_hidden = torch.empty_like(hidden) if need_hidden else None
    grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
    grad_bias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_bias else None
    loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
    in_one_matmul = True
    for start in range(0, labels.numel(), chunk_tokens):
        rows = slice(start, start + chunk_tokens)
        chunk_hidden, chunk_labels = hidden[rows], labels[rows]
        logits = F.linear(chunk_hidden, weight, bias)  # under autocast: its dtype, as the plain head's
        compute_dtype = logits.dtype
        # A float32 copy owned here (or the logits themselves where they are float32): changed in place.
        logits = logits.float()
        probabilities, chunk_loss = _softmax_and_loss(logits, chunk_labels, vocab_start, group, any(needs))
        loss += chunk_loss
        del logits
        if probabilities is None:
            continue
        grad_logits = probabilities.to(compute_dtype)
        del probabilities
        # Without autocast and with one dtype throughout, the matmuls write into the gradients directly.
        direct = not torch.is_autocast_enabled(hidden.device.type) and hidden.dtype == weight.dtype == compute_dtype
        if need_hidden and direct:
            torch.mm(grad_logits, weight, out=grad_hidden[rows])
        elif need_hidden:
            grad_hidden[rows] = grad_logits @ weight  # autocast casts the weight as it did in F.linear
        if need_weight and direct and compute_dtype == torch.float32:
            grad_weight.addmm_(grad_logits.t(), chunk_hidden)
        elif need_weight:
            in_one_matmul = _add_product_in_float32(
                grad_weight, grad_logits.t(), chunk_hidden.to(compute_dtype), in_one_matmul
            )
        if need_bias:
            grad_bias += grad_logits.sum(0).float()
    return loss, grad_hidden, grad_weight, grad_bias


def _add_product_in_float32(total: torch.Tensor, a: torch.Tensor, b: torch.Tensor, in_one_matmul: bool) -> bool:
    """total (float32) += a @ b (a lower precision). In one matmul that accumulates into `total` where torch
    has one for the device (CUDA's `addmm` with `out_dtype`; FakeTensorMode's meta kernel, so the dry run
    models it). Elsewhere (CPU) the product, then its float32 copy added: two more passes over weight-sized
    memory per chunk (on an H200, Llama 3.2 1B with 256-token chunks, 23 ms of a step's 143 ms of kernels).
    Returns whether to try the one matmul for the next chunk."""
    if in_one_matmul:
        try:
            torch.addmm(total, a, b, out_dtype=torch.float32, out=total)
            return True
        except NotImplementedError:  # no kernel for this device: known once per call
            pass
    total += (a @ b).float()
    return False


def _softmax_and_loss(logits, labels, vocab_start, group, with_gradient: bool):
    """(d loss / d logits = softmax - one-hot, zero on ignored rows, or None without `with_gradient`; the
    chunk's summed loss). `logits` is float32, [tokens, vocab here], and becomes the first result."""
    vocab_here = logits.shape[-1]
    local = labels - vocab_start
    valid = labels != IGNORE_INDEX
    here = valid & (local >= 0) & (local < vocab_here)
    index = torch.where(here, local, 0).unsqueeze(-1)
    label_logit = logits.gather(-1, index).squeeze(-1) * here
    row_max = logits.amax(-1)
    if group is not None:
        dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
    exponentials = logits.sub_(row_max.unsqueeze(-1)).exp_()
    sums = torch.stack([exponentials.sum(-1), label_logit])
    if group is not None:  # one all-reduce for the softmax's sum and the label's logit
        dist.all_reduce(sums, group=group)
    exp_sum, label_logit = sums
    log_sum_exp = row_max + exp_sum.log()
    loss = ((log_sum_exp - label_logit) * valid).sum()
    if not with_gradient:
        return None, loss
    # Softmax, ignored rows zeroed in the same pass, then minus the one-hot label where it lies in this slice.
    probabilities = exponentials.mul_((valid / exp_sum).unsqueeze(-1))
    probabilities.scatter_add_(-1, index, -here.to(probabilities.dtype).unsqueeze(-1))
    return probabilities, loss
