"""Output projection + cross entropy, token chunk by token chunk: the logits of all tokens never exist at once.

The plain loss materialises the logits of every token ([tokens, vocab], then float32, then log-softmax and
its gradient of that size again): for Llama 3 8B at 16k tokens x 128k vocabulary that is most of the step's
peak. Here the model's forward stops before its output head (`head_bypassed`: the head hands its input back,
its hooks skipped), and `chunked_cross_entropy` splits the final hidden states into chunks of
`chunk_tokens` tokens. Each chunk's logits are computed, reduced to a summed loss and freed; backward
recomputes them (non-reentrant `torch.utils.checkpoint`, one chunk at a time), so at most one chunk's logits
live. The cost is one more head matmul in backward (see tools/bench_memory.py).

Exactness: the result is `F.cross_entropy(logits.float(), labels)` (mean over labels != -100), summed per
chunk and divided by the count once, so value and gradients equal the plain loss's up to float rounding.
Under tensor parallelism the head's weight is a DTensor sharded over the vocabulary: each chunk's logits stay
vocab-sharded where loss parallel is on (its cross entropy runs in `loss_parallel()`, which the caller holds
around forward and backward), and are gathered per chunk where it is off. The weight is read once per loss,
not per chunk: SimpleFSDP gathers it on access; an FSDP2 unit that resharded it after its forward is
unsharded again first (`HeadLoss`), so the loss sees the unsharded weight the plain head saw.
"""

import contextlib
from collections.abc import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Replicate
from torch.utils.checkpoint import checkpoint

from titan_parallel.options.option_names import named

IGNORE_INDEX = -100
"""Labels equal to this add nothing to the loss (F.cross_entropy's default)."""


@contextlib.contextmanager
def head_bypassed(head: nn.Module) -> Iterator[None]:
    """Calls of `head` return their first argument as is, skipping its forward and hooks (e.g. tensor
    parallelism's input/output redistribution): the model's output is then the head's input, the final
    hidden states. Uses the slot `nn.Module.compile` uses for a compiled call, so no model code changes."""
    previous = head._compiled_call_impl
    head._compiled_call_impl = _first_argument
    try:
        yield
    finally:
        head._compiled_call_impl = previous


def _first_argument(hidden: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    return hidden


def chunked_cross_entropy(
    hidden: torch.Tensor, head: nn.Module, labels: torch.Tensor, chunk_tokens: int, *, loss_parallel: bool
) -> torch.Tensor:
    """The mean cross entropy of `head(hidden)` against `labels`, computed `chunk_tokens` tokens at a time.

    hidden: [..., dim], the head's input (a DTensor under sequence parallelism); labels: [...] token ids.
    head: a Linear-like module (`weight` [vocab, dim], optional `bias`). loss_parallel: the layout's choice,
    as for the plain loss (vocab-sharded logits and loss-parallel cross entropy under tensor parallelism).
    """
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens={chunk_tokens} must be positive")
    weight, bias = head.weight, getattr(head, "bias", None)  # read once: SimpleFSDP all-gathers on access
    if isinstance(weight, DTensor):
        hidden = _replicated(hidden, weight)
    hidden, labels = hidden.flatten(0, -2), labels.flatten()
    total = None
    for start in range(0, labels.numel(), chunk_tokens):
        end = start + chunk_tokens
        chunk_loss = checkpoint(
            _chunk_loss, hidden[start:end], weight, bias, labels[start:end], loss_parallel,
            use_reentrant=False, preserve_rng_state=False,
        )  # fmt: skip
        total = chunk_loss if total is None else total + chunk_loss
    count = (labels != IGNORE_INDEX).sum().to(torch.float32)
    if isinstance(total, DTensor):  # a loss-parallel loss: the same value on every tensor-parallel rank
        count = DTensor.from_local(count, total.device_mesh, total.placements, run_check=False)
    return total / count


def _chunk_loss(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor, loss_parallel: bool
) -> torch.Tensor:
    logits = F.linear(hidden, weight, bias)
    if isinstance(logits, DTensor) and not loss_parallel:
        logits = logits.full_tensor()  # as the plain head's Replicate output
    return F.cross_entropy(logits.float(), labels, reduction="sum", ignore_index=IGNORE_INDEX)


def _replicated(hidden: torch.Tensor, weight: DTensor) -> DTensor:
    """`hidden` whole on every rank of the weight's mesh, as the tensor-parallel head's input hook makes it
    (sequence-parallel hidden states are all-gathered once, not per chunk)."""
    mesh = weight.device_mesh
    placements = [Replicate()] * mesh.ndim
    if isinstance(hidden, DTensor):
        return hidden.redistribute(mesh, placements)
    return DTensor.from_local(hidden, mesh, placements, run_check=False)


def check_loss_chunking(chunk_tokens: int, head_fqn: str | None) -> None:
    """Whether the loss can be chunked `chunk_tokens` tokens at a time (0: the plain loss): only over an
    output head the model's plan declares."""
    if chunk_tokens < 0:
        raise ValueError(f"{named('loss_chunk_tokens')}={chunk_tokens} must be >= 0 (0: the plain loss)")
    if chunk_tokens and not head_fqn:
        raise ValueError(
            f"{named('loss_chunk_tokens')}={chunk_tokens} needs the model plan to declare its output head "
            f"(head_fqn); this model's plan declares none: use {named('loss_chunk_tokens')}=0"
        )


class HeadLoss:
    """The loss of a model's output, as the layout asks: `loss_fn(logits, labels)`, or with `chunk_tokens` > 0
    the chunked cross entropy of the head's input, the model having run inside `bypass()`.

    The head is found after the model is parallelized (`attach`): under pipelining only the last stage
    holds it, and other stages never compute a loss.
    """

    def __init__(self, loss_fn, chunk_tokens: int, loss_parallel: bool, head_fqn: str | None):
        check_loss_chunking(chunk_tokens, head_fqn)
        self.loss_fn, self.chunk_tokens, self.loss_parallel, self.head_fqn = (
            loss_fn, chunk_tokens, loss_parallel, head_fqn,
        )  # fmt: skip
        self.head: nn.Module | None = None
        self._fsdp_owner: FSDPModule | None = None

    def attach(self, parts: list[nn.Module]) -> None:
        if not self.chunk_tokens:
            return
        for part in parts:
            try:
                self.head = part.get_submodule(self.head_fqn)
            except AttributeError:  # another pipeline stage's
                continue
            # The innermost FSDP2 unit holding the head (the root, as Titan shards): its parameters may be
            # resharded when its forward returns, and the loss runs after that.
            names = self.head_fqn.split(".")
            for depth in range(len(names) + 1):
                module = part.get_submodule(".".join(names[:depth]))
                if isinstance(module, FSDPModule):
                    self._fsdp_owner = module
            return

    def chunk_tokens_in(self, part: nn.Module) -> int | None:
        """The chunk size where `part` holds the head the loss is chunked over; None elsewhere."""
        held = self.head is not None and any(module is self.head for module in part.modules())
        return self.chunk_tokens if held else None

    def bypass(self) -> contextlib.AbstractContextManager:
        """Where the model's forward (and a pipeline schedule's) runs: the head hands back its input."""
        return head_bypassed(self.head) if self.head is not None else contextlib.nullcontext()

    def __call__(self, output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.head is None:
            return self.loss_fn(output, labels)
        if self._fsdp_owner is not None:
            # Gathered again (a no-op where the forward left it so); FSDP's backward hooks reduce-scatter the
            # head's gradient and reshard it as after any forward.
            self._fsdp_owner.unshard()
        return chunked_cross_entropy(output, self.head, labels, self.chunk_tokens, loss_parallel=self.loss_parallel)
