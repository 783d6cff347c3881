"""Drafting tokens with a decoder's multi-token prediction modules (decoder/mtp.py), incrementally.

Module k at position s reads the previous depth's hidden state there (the main model's final block output for
k = 1) and the embedding of token s + k, and attends over its own inputs at positions 0..s: like a main block,
it keeps a KV cache, fed as the sequence grows. At the last position `last` whose next token is known, the chain
drafts: module 1 reads token last + 1 and predicts last + 2, module 2 reads that guess and predicts last + 3, ...

Depth k's input at position s is final once token s + k is: for s > last + 1 - k it reads a drafted token, which a
verification may reject. Each depth remembers how many of its positions are final (`final`) and recomputes the
rest at the next draft, so a rejected guess never stays in its cache.
"""

from __future__ import annotations

import torch

from titan_models.generate.llama_decode import LlamaDecoder


class MTPDrafter:
    """The MTP modules' caches for the sequences of `decoder` (a LlamaDecoder of a Decoder with mtp_layers > 0).

    observe(start, hidden) after each main forward, then draft(tokens, last, n) -> n guessed tokens per row.
    """

    def __init__(self, decoder: LlamaDecoder):
        model = decoder.model
        if model.mtp is None:
            raise ValueError("MTPDrafter needs a model with multi-token prediction modules (mtp_layers > 0)")
        if any(window is not None for window in decoder.windows):
            raise ValueError("MTPDrafter needs full KV caches; this model's sliding layers roll theirs (no rewind)")
        self.decoder, self.model = decoder, model
        self.modules = list(model.mtp.values())
        batch_size, max_len = decoder.key_valid.shape
        weight = model.output.weight
        # hidden[k]: depth k's output at each position (hidden[0]: the main model's, before its final norm).
        self.hidden = [weight.new_zeros(batch_size, max_len, model.args.dim) for _ in range(len(self.modules) + 1)]
        self.keys = [torch.zeros_like(decoder.keys[0]) for _ in self.modules]
        self.values = [torch.zeros_like(decoder.values[0]) for _ in self.modules]
        self.final = [0] * (len(self.modules) + 1)  # final[k]: depth k's positions 0..final[k]-1 are final

    @property
    def depth(self) -> int:
        """How many tokens one draft can guess: the number of MTP modules."""
        return len(self.modules)

    def observe(self, start: int, hidden: torch.Tensor) -> None:
        """The main model's final block output [B, S, dim] at positions start..start+S-1 (LlamaDecoder.last_hidden);
        only those whose tokens are accepted are read later, the rest are overwritten first."""
        self.hidden[0][:, start : start + hidden.shape[1]] = hidden

    @torch.no_grad()
    def draft(self, tokens: torch.Tensor, last: int, n: int) -> torch.Tensor:
        """n (<= depth) guesses [B, n] for the tokens at positions last + 2 .. last + 1 + n.

        tokens [B, last + 2]: the final tokens so far, up to the main model's prediction at `last`, which it has
        read up to position last (observed)."""
        if not 0 <= n <= self.depth:
            raise ValueError(f"a draft of {n} tokens: this model has {self.depth} MTP modules")
        known = tokens
        for k, module in enumerate(self.modules[:n], start=1):
            start = self.final[k]
            embedded = self.model.tok_embeddings(known[:, start + k : last + 1 + k])
            previous = self.hidden[k - 1][:, start : last + 1]
            x = module.eh_proj(torch.cat([module.enorm(embedded), module.hnorm(previous)], dim=-1))
            h = self.decoder.cached_block(module.block, x, self.keys[k - 1], self.values[k - 1], start)
            self.hidden[k][:, start : last + 1] = h
            self.final[k] = max(0, last + 2 - k)  # positions from here on read a guess (or a token not known yet)
            guess = self.model.output(module.shared_head.norm(h[:, -1])).argmax(dim=-1)
            known = torch.cat([known, guess[:, None]], dim=1)
        return known[:, tokens.shape[1] :]
