"""Multi-token prediction (DeepSeek-V3, arXiv 2412.19437 section 2.2): after the main decoder, D sequential modules,
module k predicting at position t the token t + 1 + k.

Module k takes the previous depth's hidden state h^{k-1}_t (the main model's last block output for k = 1, before
its final norm) and the embedding of token t + k, normalizes each with an RMSNorm of its own, concatenates them
[enorm(emb); hnorm(h)], projects 2*dim -> dim (eh_proj), runs one decoder block (dense or MoE as the model's last
block) and reads the shared output head through a final norm of its own (shared_head.norm).

The concatenation order is the released checkpoints' (DeepSeek's inference code and every loader of its weights
compute eh_proj(cat([enorm(emb), hnorm(h)]))), not the paper's equation (21), which writes [h; emb]: the order
only permutes eh_proj's columns, and keeping the checkpoints' lets their eh_proj load unchanged.

Names mirror Hugging Face's `model.layers.{n_layers + k - 1}.{enorm,hnorm,eh_proj,shared_head.norm}`; the block's
own names are our TransformerBlock's, mapped like any other block's.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from titan_models.decoder.args import DecoderArgs
from titan_models.decoder.block import TransformerBlock
from titan_models.decoder.layers import RMSNorm
from titan_models.moe import RoutedTokens
from titan_models.seeded_init import SeededInit

IGNORE_INDEX = -100
"""Labels with this value are left out of the loss (torch's cross_entropy default, titan-train's IGNORE_INDEX)."""


class MTPDepth(NamedTuple):
    """One depth's inputs and labels, [bs, seqlen] each."""

    inputs: torch.Tensor
    """The token k positions ahead, the module's embedding input; 0 where there is none (its label is ignored)."""
    labels: torch.Tensor
    """labels shifted k left: token t + 1 + k at position t; IGNORE_INDEX where the shift leaves the row or the
    document of position t, or where the main loss ignores position t + k."""


def document_ids_from_positions(positions: torch.Tensor) -> torch.Tensor:
    """Document ids [.., seqlen] of a packed row whose positions restart at 0 at each document's first token."""
    return torch.cumsum((positions == 0).long(), dim=-1)


def shift_document_ids(positions: torch.Tensor | None, document_ids: torch.Tensor | None) -> torch.Tensor | None:
    """The documents an MTP shift must not cross, from a forward's per-token arguments: document_ids, else those
    of per-row positions that restart at each document ([bs, seqlen]); None: one document per row."""
    if document_ids is not None:
        return document_ids
    if positions is not None and positions.dim() == 2:
        return document_ids_from_positions(positions)
    return None


def mtp_targets(
    tokens: torch.Tensor, labels: torch.Tensor, depths: int, document_ids: torch.Tensor | None = None
) -> list[MTPDepth]:
    """Per-depth inputs and labels for depths 1..`depths`.

    tokens, labels: [bs, seqlen], labels[t] the token after tokens[t] (IGNORE_INDEX where not learned).
    document_ids: [bs, seqlen] or None (one document per row). Depth k at position t reads tokens[t + k] and learns
    labels[t + k]; it is ignored where t + k >= seqlen or document_ids[t + k] != document_ids[t], so no shifted
    token comes from the next document or from past the row. Within a document the ignored positions are a suffix,
    so under causal attention no kept position reads an ignored one's input.
    """
    seqlen = tokens.shape[-1]
    out = []
    for k in range(1, depths + 1):
        keep = torch.zeros_like(tokens, dtype=torch.bool)
        if k < seqlen:
            keep[..., : seqlen - k] = True
            if document_ids is not None:
                keep[..., : seqlen - k] &= document_ids[..., k:] == document_ids[..., :-k]
        shifted_tokens = torch.zeros_like(tokens)
        shifted_labels = torch.full_like(labels, IGNORE_INDEX)
        if k < seqlen:
            shifted_tokens[..., :-k] = tokens[..., k:]
            shifted_labels[..., :-k] = labels[..., k:]
        out.append(
            MTPDepth(
                torch.where(keep, shifted_tokens, torch.zeros_like(tokens)),
                torch.where(keep, shifted_labels, torch.full_like(labels, IGNORE_INDEX)),
            )
        )
    return out


class SharedHead(nn.Module):
    """The module's own final norm before the output projection it shares with the main model (HF:
    `shared_head.norm`; the checkpoints' `shared_head.head` is a copy of the main head, not loaded)."""

    def __init__(self, args: DecoderArgs):
        super().__init__()
        self.norm = RMSNorm(args.dim, eps=args.norm_eps)


class MTPModule(nn.Module):
    """Depth k's module: enorm, hnorm, eh_proj, one decoder block, shared_head.norm."""

    def __init__(self, depth: int, args: DecoderArgs):
        super().__init__()
        self.depth = depth
        self.enorm = RMSNorm(args.dim, eps=args.norm_eps)
        self.hnorm = RMSNorm(args.dim, eps=args.norm_eps)
        self.eh_proj = nn.Linear(2 * args.dim, args.dim, bias=False)
        # The kind of the model's last block: dense or a mixture of experts.
        self.block = TransformerBlock(args.n_layers - 1, args)
        self.shared_head = SharedHead(args)

    def forward(
        self,
        hidden: torch.Tensor,
        embedded: torch.Tensor,
        freqs_cis: torch.Tensor,
        document_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, RoutedTokens | None]:
        """hidden: h^{k-1} [bs, seqlen, dim]; embedded: the embedding of tokens k ahead. Returns h^k (before
        shared_head.norm, the next depth's input) and the block's routing (None for a dense block)."""
        x = self.eh_proj(torch.cat([self.enorm(embedded), self.hnorm(hidden)], dim=-1))
        return self.block(x, freqs_cis, document_ids=document_ids)

    def init_weights(self, init: SeededInit) -> None:
        for norm in (self.enorm, self.hnorm, self.shared_head.norm):
            norm.reset_parameters()
        init.trunc_normal_(self.eh_proj.weight, std=0.02)
        self.block.init_weights(init)
