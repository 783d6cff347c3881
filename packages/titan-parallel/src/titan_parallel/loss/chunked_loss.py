"""Output projection + cross entropy, token chunk by token chunk: the logits of all tokens never exist at once.

The plain loss materialises the logits of every token ([tokens, vocab], then float32, then log-softmax and
its gradient of that size again): for Llama 3 8B at 16k tokens x 128k vocabulary that is most of the step's
peak. Here the model's forward stops before its output head (`head_bypassed`: the head hands its input back,
its hooks skipped), and `chunked_cross_entropy` splits the final hidden states into chunks of
`chunk_tokens` tokens, each chunk's logits freed before the next. Two ways to get the gradients:
- "in_forward" (the default): each chunk's gradients are computed right after its softmax, in the forward
  pass, and backward only scales them (gradients_in_forward.py): the plain loss's three vocabulary-sized
  matmuls, no logits kept, the head weight's float32 gradient held from the loss to its backward.
- "recompute": each chunk's loss is checkpointed (non-reentrant `torch.utils.checkpoint`) and backward
  recomputes its logits: a fourth head matmul (tools/bench_memory.py), nothing held between forward and
  backward. Kept for what the gradients-in-forward path cannot do: a double backward (create_graph), and a
  step too tight for the weight-sized gradient buffer.

Exactness: the result is `F.cross_entropy(logits.float(), labels)` (mean over labels != -100), summed per
chunk and divided by the count once, so value and gradients equal the plain loss's up to float rounding.
Under tensor parallelism the head's weight is a DTensor sharded over the vocabulary. In forward the softmax
is then computed sharded (its max and sum all-reduced), whether or not loss parallel is on: the logits are
never gathered. The recompute path keeps each chunk's logits vocab-sharded where loss parallel is on (its
cross entropy runs in `loss_parallel()`, which the caller holds around forward and backward), and gathers
them per chunk where it is off. The weight is read once per loss, not per chunk: SimpleFSDP gathers it on
access; an FSDP2 unit that resharded it after its forward is unsharded again first (`HeadLoss`), so the loss
sees the unsharded weight the plain head saw.
"""

import contextlib
from collections.abc import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.utils.checkpoint import checkpoint

from titan_parallel.loss.gradients_in_forward import IGNORE_INDEX, linear_cross_entropy_sum
from titan_parallel.options.option_names import named

CHUNK_GRADIENTS = ("in_forward", "recompute")


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
    hidden: torch.Tensor,
    head: nn.Module,
    labels: torch.Tensor,
    chunk_tokens: int,
    *,
    loss_parallel: bool,
    gradients: str = "in_forward",
) -> torch.Tensor:
    """The mean cross entropy of `head(hidden)` against `labels`, computed `chunk_tokens` tokens at a time.

    hidden: [..., dim], the head's input (a DTensor under sequence parallelism); labels: [...] token ids.
    head: a Linear-like module (`weight` [vocab, dim], optional `bias`). loss_parallel: the layout's choice,
    as for the plain loss (vocab-sharded logits and loss-parallel cross entropy under tensor parallelism; the
    "in_forward" gradients compute the softmax sharded either way). gradients: "in_forward" or "recompute".
    """
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens={chunk_tokens} must be positive")
    if gradients not in CHUNK_GRADIENTS:
        raise ValueError(f"gradients={gradients!r}: use one of {CHUNK_GRADIENTS}")
    weight, bias = head.weight, getattr(head, "bias", None)  # read once: SimpleFSDP all-gathers on access
    labels = labels.flatten()
    count = (labels != IGNORE_INDEX).sum().to(torch.float32)
    if gradients == "in_forward":
        hidden, weight, bias, vocab_start, group = _local_operands(hidden, weight, bias)
        total = linear_cross_entropy_sum(hidden.flatten(0, -2), weight, bias, labels, chunk_tokens, vocab_start, group)
        return total / count
    if isinstance(weight, DTensor):
        hidden = _replicated(hidden, weight)
    hidden = hidden.flatten(0, -2)
    total = None
    for start in range(0, labels.numel(), chunk_tokens):
        end = start + chunk_tokens
        chunk_loss = checkpoint(
            _chunk_loss, hidden[start:end], weight, bias, labels[start:end], loss_parallel,
            use_reentrant=False, preserve_rng_state=False,
        )  # fmt: skip
        total = chunk_loss if total is None else total + chunk_loss
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


def _local_operands(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """(hidden, weight, bias) as this rank's plain tensors, the first vocabulary row its weight holds, and the
    process group holding the other rows (None: all rows here). A DTensor weight is replicated, or sharded
    over the vocabulary (dim 0) on one mesh dimension; the hidden states are then made whole on every rank
    and their gradient left a partial sum over the shard group, reduced by the DTensor redistribution that
    made them whole."""
    if not isinstance(weight, DTensor):
        return hidden, weight, bias, 0, None
    mesh, placements = weight.device_mesh, weight.placements
    sharded = [dim for dim, p in enumerate(placements) if p.is_shard(0)]
    others = [p for dim, p in enumerate(placements) if dim not in sharded]
    if len(sharded) > 1 or not all(p.is_replicate() for p in others):
        raise ValueError(
            f"the chunked loss needs the output head's weight replicated or split over the vocabulary on one mesh "
            f"dimension; it is placed {placements} on {mesh}"
        )
    hidden = _replicated(hidden, weight)
    local_bias = bias.to_local() if isinstance(bias, DTensor) else bias
    if not sharded:
        return hidden.to_local(), weight.to_local(), local_bias, 0, None
    (dim,) = sharded
    grad_placements = [Partial() if d == dim else Replicate() for d in range(mesh.ndim)]
    shards, rank = mesh.size(dim), mesh.get_local_rank(dim)
    rows = -(-weight.shape[0] // shards)  # DTensor's Shard: torch.chunk's split, the last shards shorter
    vocab_start = min(rank * rows, weight.shape[0])
    return (
        hidden.to_local(grad_placements=grad_placements), weight.to_local(), local_bias, vocab_start,
        mesh.get_group(dim),
    )  # fmt: skip


def _replicated(hidden: torch.Tensor, weight: DTensor) -> DTensor:
    """`hidden` whole on every rank of the weight's mesh, as the tensor-parallel head's input hook makes it
    (sequence-parallel hidden states are all-gathered once, not per chunk)."""
    mesh = weight.device_mesh
    placements = [Replicate()] * mesh.ndim
    if isinstance(hidden, DTensor):
        return hidden.redistribute(mesh, placements)
    return DTensor.from_local(hidden, mesh, placements, run_check=False)


def check_loss_chunking(chunk_tokens: int, head_fqn: str | None, gradients: str = "in_forward") -> None:
    """Whether the loss can be chunked `chunk_tokens` tokens at a time (0: the plain loss): only over an
    output head the model's plan declares."""
    if gradients not in CHUNK_GRADIENTS:
        allowed = " or ".join(repr(g) for g in CHUNK_GRADIENTS)
        raise ValueError(f"{named('loss_chunk_gradients')}={gradients!r}: use {allowed}")
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

    A chunked loss replaces `loss_fn`, taken to be the plain cross entropy of the head's output. A loss of
    several heads' outputs (multi-token prediction: the main head and each depth's pass through the same head)
    says how it is computed over a chunked head by a method `over_chunked_head(cross_entropy) -> loss_fn`: the
    returned function gets the model's output with the head bypassed (the hidden states wherever the head
    was called) and computes each head's cross entropy as `cross_entropy(hidden, labels)`.

    The head is found after the model is parallelized (`attach`): under pipelining only the last stage
    holds it, and other stages never compute a loss.
    """

    def __init__(
        self, loss_fn, chunk_tokens: int, loss_parallel: bool, head_fqn: str | None, gradients: str = "in_forward"
    ):
        check_loss_chunking(chunk_tokens, head_fqn, gradients)
        self.loss_fn, self.chunk_tokens, self.loss_parallel, self.head_fqn, self.gradients = (
            loss_fn, chunk_tokens, loss_parallel, head_fqn, gradients,
        )  # fmt: skip
        self.head: nn.Module | None = None
        self._fsdp_owner: FSDPModule | None = None
        over_chunked_head = getattr(loss_fn, "over_chunked_head", None)
        self._chunked_loss_fn = over_chunked_head(self.cross_entropy) if over_chunked_head else self.cross_entropy

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
        return self._chunked_loss_fn(output, labels)

    def cross_entropy(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The chunked cross entropy of the head over `hidden`, the head's input (attached, chunking on)."""
        return chunked_cross_entropy(
            hidden, self.head, labels, self.chunk_tokens, loss_parallel=self.loss_parallel, gradients=self.gradients
        )


AUTO_MIN_CHUNK_TOKENS = 256
"""The auto chunk's floor: fewer tokens make the head's matmuls too small to run the device at speed."""


def auto_loss_chunk_tokens(tokens: int, vocab_here: int, dim: int) -> int:
    """The chunk `loss_chunk_tokens = "auto"` picks for micro-batches of `tokens` tokens (per rank, as the
    loss sees them) and a head of `vocab_here` rows (the vocabulary, or this rank's slice of it) x `dim`.

    0 (the plain loss) where the micro-batch's logits are no larger than the head's weight (tokens <= dim):
    the gradients-in-forward loss holds a float32 gradient of the weight's size from the loss to its backward,
    so it saves memory only where the float32 logits it never keeps are larger. Elsewhere dim / 2 tokens
    (a power of two, at least AUTO_MIN_CHUNK_TOKENS): each chunk adds its weight gradient into that float32
    gradient, a pass over weight-sized memory that takes as long as the chunk's three matmuls at ~220 tokens
    on an H100 or H200 (bf16 FLOP/s over bytes/s ~165), and ~220 / (dim / 2) of them at dim / 2 tokens. The
    chunk's logits then hold half as many elements as the weight, so most of the saving over the plain loss
    stays."""
    del vocab_here  # both the logits and the weight's gradient scale with this rank's slice of the vocabulary
    if tokens <= dim:
        return 0
    return max(AUTO_MIN_CHUNK_TOKENS, 1 << (max(dim // 2, 1) - 1).bit_length())
