"""Document masking for packed sequences (`model.attention_mask`, `model.positions`): each token's document
and its position within it, derived from the input tokens alone.

The packer frames every document as BOS + tokens + EOS and cuts the stream into windows, so a document
starts at each BOS token; the tokens before a window's first BOS are the tail of a document cut by the
window start, a document of their own. Derived from the whole (unsharded) inputs by the ParallelModel
before context-parallel sharding, so ids and positions are global whatever the layout, and no data format
has to carry them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from titan_train.config.loader import ConfigError
from titan_train.config.sections import JobConfig


def document_ids(inputs: torch.Tensor, bos_id: int) -> torch.Tensor:
    """[B, S] document index of each token, counted from 0 per row: +1 at every BOS (except at position 0)."""
    starts = inputs == bos_id
    starts[:, 0] = False  # a window starting on a BOS is document 0 all the same
    return starts.cumsum(dim=1)


def document_positions(ids: torch.Tensor) -> torch.Tensor:
    """[B, S] position of each token within its document (0 at each document's first token)."""
    index = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    return index - torch.where(starts, index, 0).cummax(dim=1).values


def document_kwargs(config: JobConfig, bos_id: int) -> Callable[[torch.Tensor], dict[str, torch.Tensor]] | None:
    """The per-token model arguments `model.attention_mask` / `model.positions` ask for (titan_parallel's
    TokenKwargs), or None for plain causal attention on sequence positions."""
    block_causal = config.model.attention_mask == "block_causal"
    per_document = config.model.positions == "document"
    if not (block_causal or per_document):
        return None

    def kwargs(inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        ids = document_ids(inputs, bos_id)
        found = {"document_ids": ids} if block_causal else {}
        if per_document:
            found["positions"] = document_positions(ids)
        return found

    return kwargs


def check_document_masking(config: JobConfig) -> None:
    """Refuse, before anything is built, what cannot carry document masking."""
    m, p = config.model, config.parallelism
    if m.attention_mask == "causal" and m.positions == "sequence":
        return
    if m.name != "llama3":
        raise ConfigError(
            f"model.attention_mask={m.attention_mask!r} / model.positions={m.positions!r} are implemented for "
            f"model.name='llama3', not {m.name!r}; use model.attention_mask='causal' and model.positions='sequence'"
        )
    torch_ring = p.context_parallel_degree > 1 and p.context_parallel_implementation == "torch"
    if m.attention_mask == "block_causal" and torch_ring:
        raise ConfigError(
            "model.attention_mask='block_causal' with context parallelism needs "
            "parallelism.context_parallel_implementation='titan' (torch's ring takes no document mask)"
        )
