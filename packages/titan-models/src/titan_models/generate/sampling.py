"""Choosing the next token from logits: greedy, or sampling with temperature and top-k."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def sample_next(
    logits: torch.Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
) -> torch.Tensor:
    """logits [B, V] -> token ids [B]. temperature 0 is greedy (argmax); otherwise softmax(logits / T)
    restricted to the top_k most likely tokens (None or 0: all), drawn with `generator`, or with one
    generator per row (B of them: row r then draws what it would draw alone with generator[r])."""
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0 (0 is greedy)")
    if temperature == 0:
        return logits.argmax(dim=-1)
    scaled = logits.float() / temperature
    if top_k:
        kth = torch.topk(scaled, min(top_k, scaled.shape[-1]), dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if generator is None or isinstance(generator, torch.Generator):
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    if len(generator) != probs.shape[0]:
        raise ValueError(f"{len(generator)} generators for {probs.shape[0]} rows; pass one per row")
    return torch.cat([torch.multinomial(row[None], 1, generator=g)[0] for row, g in zip(probs, generator, strict=True)])
