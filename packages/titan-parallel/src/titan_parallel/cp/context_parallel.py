"""Context parallelism: the sequence split over the cp ranks, and the model's attention modules swapped for
ring attention (and linear attention's token-mixing steps for versions that carry their state and convolution
halo across ranks: linear_attention_cp.py).

Causal attention gives late tokens more work than early ones, so a plain split would leave the last rank
with most of it. The sequence is cut into 2*cp chunks and rank i holds chunks i and 2*cp-1-i (one early, one
late): every rank does the same work. Tokens, labels and positions are sharded alike; RoPE follows the
global positions (`load_balanced_positions`). Every rank holds the same number of tokens, so the mean of the
ranks' mean losses is the loss of the whole sequence.

    apply_cp(model, cp_mesh, ["layers.*.attention.inner_attention"])        # once, at build time
    positions = load_balanced_positions(seq_len, cp_mesh.size(), cp_mesh.get_local_rank(), device)
    tokens, labels = shard_sequence([tokens, labels], cp_mesh)               # every batch
    loss = loss_fn(model(tokens, positions), labels)
    loss.backward()

The swap is explicit and local to the model: no process-wide patch of `F.scaled_dot_product_attention`, so
a model calling attention any other way is not silently left with local attention: `apply_cp` refuses a
model whose plan names no attention module."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from titan_parallel.cp.linear_attention_cp import SWAPS as LINEAR_ATTENTION_SWAPS
from titan_parallel.cp.ring_attention import VARIANTS, ring_attention_by_name
from titan_parallel.cp.ring_comm import cp_group
from titan_parallel.cp.whole_sequence import whole_sequence
from titan_parallel.params.module_patterns import fqn_matches

IMPLEMENTATIONS = ("titan", "torch")


def load_balanced_positions(seq_len: int, cp: int, rank: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Global positions of the tokens rank `rank` of `cp` holds, in local order: chunks rank and
    2*cp-1-rank of 2*cp equal chunks."""
    if seq_len % (2 * cp):
        valid = ", ".join(str(2 * cp * m) for m in range(max(1, seq_len // (2 * cp)), seq_len // (2 * cp) + 3))
        raise ValueError(
            f"sequence length {seq_len} is not divisible by 2 x context_parallel_degree = {2 * cp} (each rank "
            f"holds two equal chunks for causal load balancing); use a multiple of {2 * cp}, e.g. {valid}"
        )
    chunk = seq_len // (2 * cp)
    first = torch.arange(rank * chunk, (rank + 1) * chunk, device=device)
    return torch.cat([first, first + (2 * cp - 1 - 2 * rank) * chunk])


def shard_sequence(
    tensors: Sequence[torch.Tensor], cp_mesh: DeviceMesh | dist.ProcessGroup, seq_dim: int = 1
) -> list[torch.Tensor]:
    """This rank's load-balanced shard of each tensor along `seq_dim` (e.g. tokens and labels [B, S])."""
    group = cp_group(cp_mesh)
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    shards = []
    for tensor in tensors:
        index = load_balanced_positions(tensor.shape[seq_dim], cp, rank, tensor.device)
        shards.append(tensor.index_select(seq_dim, index))
    return shards


def unshard_sequence(tensor: torch.Tensor, cp_mesh: DeviceMesh | dist.ProcessGroup, seq_dim: int = 1) -> torch.Tensor:
    """The whole sequence from every rank's shard, in global order (a collective; not differentiable)."""
    group = cp_group(cp_mesh)
    return whole_sequence(tensor.detach(), group.group_name, dist.get_world_size(group), seq_dim)


class RingAttention(nn.Module):
    """Drop-in for an attention-kernel module (forward(q, k, v) -> out, [B, H, S_local, D], SDPA's layout) on
    a sequence sharded by `shard_sequence`: ring attention over the context-parallel group."""

    def __init__(
        self,
        cp_mesh: DeviceMesh | dist.ProcessGroup,
        *,
        is_causal: bool,
        variant: str,
        kernel: str,
        scale: float | None = None,
        sliding_window: int | None = None,
    ):
        super().__init__()
        group = cp_group(cp_mesh)
        # Plain values, resolved here outside any compiled region: the op takes the group by name.
        self.group_name, self.cp, self.rank = group.group_name, dist.get_world_size(group), dist.get_rank(group)
        self.is_causal, self.variant, self.kernel, self.scale = is_causal, variant, kernel, scale
        self.sliding_window = sliding_window
        """Keys a query sees, itself included, in global positions (None: no window); kept from the swapped module."""

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        document_ids: torch.Tensor | None = None,
        *,
        sinks: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """document_ids: this rank's shard [B, S_local] of each token's document (block-causal attention).
        sinks [H]: a learned logit per head in the softmax denominator. positions: accepted for the swapped
        module's interface and not read -- the load-balanced layout fixes every token's global position, which
        is what the window is measured in."""
        return ring_attention_by_name(
            q,
            k,
            v,
            self.group_name,
            self.cp,
            self.is_causal,
            self.scale,
            self.variant,
            self.kernel,
            document_ids,
            self.sliding_window,
            sinks,
        )

    def keys_for_max_logit(
        self, k: torch.Tensor, document_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """For QK-clip's record (titan_models.decoder.max_logit.record_head_max_logits): every rank's keys in global
        order, this rank's queries' global positions, the keys' positions and their documents. A collective over the
        ring's group, outside autograd."""
        length = k.shape[2] * self.cp
        keys = whole_sequence(k.detach(), self.group_name, self.cp, 2)
        documents = None if document_ids is None else whole_sequence(document_ids, self.group_name, self.cp, 1)
        positions = load_balanced_positions(length, self.cp, self.rank, k.device)
        return keys, positions, torch.arange(length, device=k.device), documents

    def extra_repr(self) -> str:
        window = "" if self.sliding_window is None else f", sliding_window={self.sliding_window}"
        return f"cp={self.cp}, is_causal={self.is_causal}, variant={self.variant!r}{window}"


def apply_cp(
    model: nn.Module,
    cp_mesh: DeviceMesh | dist.ProcessGroup,
    attention_fqns: list[str],
    *,
    variant: str = "p2p",
    implementation: str = "titan",
    kernel: str = "auto",
) -> list[str]:
    """Swap the modules matching `attention_fqns` (patterns, "*" matches one name; e.g.
    "layers.*.attention.inner_attention") for context-parallel attention over `cp_mesh`. In place; returns
    the FQNs swapped. Each must compute attention from (q, k, v) alone (plus document_ids and attention sinks by
    keyword); its `is_causal` attribute (default True), softmax `scale` (default None: 1 / sqrt(head width)) and
    `sliding_window` (default None) are kept. The model is then fed
    `shard_sequence`'d inputs, and its positions (RoPE) must follow `load_balanced_positions`.

    A matched module whose `cp_style` names a linear-attention step ("gated_delta_rule", "causal_conv": Gated
    DeltaNet's parameter-free seams) is wrapped instead by its context-parallel version (linear_attention_cp.py),
    which carries the recurrent state and the convolution's halo across ranks; `variant`, `implementation` and
    `kernel` concern ring attention only.

    `variant`: "p2p" or "allgather" (see ring_attention.py). `implementation`: "titan" (this ring
    attention, any device) or "torch" (torch's experimental context parallelism, CUDA only: its sharding
    order is the same head-tail one). `kernel`: per-block kernel of the titan ring, see `ring_attention`.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r} is not one of {VARIANTS}")
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation={implementation!r} is not one of {IMPLEMENTATIONS}")
    if implementation == "torch":
        _check_torch_cp(cp_mesh)
    swapped = []
    for fqn, module in list(model.named_modules()):
        if not any(fqn_matches(pattern, fqn) for pattern in attention_fqns):
            continue
        linear = LINEAR_ATTENTION_SWAPS.get(getattr(module, "cp_style", None))
        if linear is not None:
            parent, _, name = fqn.rpartition(".")
            setattr(model.get_submodule(parent), name, linear(module, cp_mesh))
            swapped.append(fqn)
            continue
        is_causal, scale = getattr(module, "is_causal", True), getattr(module, "scale", None)
        window = getattr(module, "sliding_window", None)
        if implementation == "torch":
            if scale is not None:
                raise ValueError(f"{fqn}: a softmax scale of its own ({scale}) needs implementation='titan'")
            if window is not None:
                raise ValueError(f"{fqn}: a sliding window ({window} keys) needs implementation='titan'")
            _apply_torch_cp(module, cp_mesh, variant)
        else:
            parent, _, name = fqn.rpartition(".")
            ring = RingAttention(
                cp_mesh, is_causal=is_causal, variant=variant, kernel=kernel, scale=scale, sliding_window=window
            )
            setattr(model.get_submodule(parent), name, ring)
        swapped.append(fqn)
    if not swapped and attention_fqns:
        raise ValueError(f"attention_fqns={attention_fqns} match no module of {type(model).__name__}")
    return swapped


def _check_torch_cp(cp_mesh) -> None:
    if not isinstance(cp_mesh, DeviceMesh) or cp_mesh.device_type != "cuda":
        kind = cp_mesh.device_type if isinstance(cp_mesh, DeviceMesh) else type(cp_mesh).__name__
        raise ValueError(
            f"implementation='torch' needs a CUDA DeviceMesh (torch's context parallelism has no CPU attention "
            f"strategy), got {kind}; use implementation='titan'"
        )


def _apply_torch_cp(module: nn.Module, cp_mesh: DeviceMesh, variant: str) -> None:
    # torch's SDPA style (as TorchTitan applies it to inner_attention): the module's q/k/v become DTensors
    # sharded on the sequence, dispatched to torch's ring; our shards already use its head-tail order.
    from torch.distributed.tensor.experimental._context_parallel import (
        _ContextParallel,
        _enable_context_parallel_dispatcher,
        set_rotate_method,
    )
    from torch.distributed.tensor.parallel import parallelize_module

    set_rotate_method("alltoall" if variant == "p2p" else "allgather")
    _enable_context_parallel_dispatcher()
    style = _ContextParallel(seq_dim=2, attention_type=_ContextParallel.AttentionType.SDPA)
    parallelize_module(module, cp_mesh, style)
