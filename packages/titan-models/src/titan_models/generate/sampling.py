"""Choosing the next token from logits: greedy, or sampling with temperature and top-k."""

from __future__ import annotations

import torch


def sample_next(
    logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None, generator: torch.Generator | None = None
) -> torch.Tensor:
    """logits [B, V] -> token ids [B]. temperature 0 is greedy (argmax); otherwise softmax(logits / T)
    restricted to the top_k most likely tokens (None or 0: all), drawn with `generator`."""
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0 (0 is greedy)")
    if temperature == 0:
        return logits.argmax(dim=-1)
    scaled = logits.float() / temperature
    if top_k:
        kth = torch.topk(scaled, min(top_k, scaled.shape[-1]), dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
