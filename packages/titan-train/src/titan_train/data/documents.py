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


def document_kwargs(
    attention_mask: str, positions: str, bos_id: int
) -> Callable[[torch.Tensor], dict[str, torch.Tensor]] | None:
    """The per-token model arguments `model.attention_mask` ("causal" | "block_causal") and `model.positions`
    ("sequence" | "document") ask for (titan_parallel's TokenKwargs), or None for plain causal attention on
    sequence positions."""
    block_causal = attention_mask == "block_causal"
    per_document = positions == "document"
    if not (block_causal or per_document):
        return None

    def kwargs(inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        ids = document_ids(inputs, bos_id)
        found = {"document_ids": ids} if block_causal else {}
        if per_document:
            found["positions"] = document_positions(ids)
        return found

    return kwargs
