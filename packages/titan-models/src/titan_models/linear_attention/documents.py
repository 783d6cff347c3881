"""Packed documents as the recurrence sees them. document_ids [B, S] is what the decoder's block_causal_mask reads;
a linear-attention layer carries a state from token to token, so what matters here is where a document begins:
wherever the id changes from one token to the next. A document is a run of equal ids (an id that comes back after
another starts a new document, where block_causal_mask would join the two runs)."""

from __future__ import annotations

import torch


def document_starts(document_ids: torch.Tensor) -> torch.Tensor:
    """Bool [B, S]: True at each token whose id differs from the previous token's; never at token 0, which
    continues whatever state the caller passes in."""
    starts = torch.zeros_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    return starts


def document_runs(document_ids: torch.Tensor) -> torch.Tensor:
    """Long [B, S]: 0 for the first document of each row, 1 for the next, ...: equal exactly within one run."""
    return document_starts(document_ids).long().cumsum(-1)
