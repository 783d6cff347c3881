"""generate(): prompts in, new tokens out, for any registered model family with a decoder."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from titan_models.generate.hyena_decode import HyenaDecoder
from titan_models.generate.llama_decode import LlamaDecoder
from titan_models.generate.sampling import sample_next
from titan_models.hyena.model import HyenaLM
from titan_models.llama3.model import Llama3


def build_decoder(
    model: nn.Module, max_len: int, batch_size: int = 1, strategy: str = "flash"
) -> HyenaDecoder | LlamaDecoder:
    """The incremental decoder for `model`: a KV cache for Llama 3, online long convolutions for Hyena
    (strategy "lazy", "eager" or "flash"; Llama ignores it)."""
    if isinstance(model, HyenaLM):
        return HyenaDecoder(model, max_len, strategy=strategy, batch_size=batch_size)
    if isinstance(model, Llama3):
        return LlamaDecoder(model, max_len, batch_size=batch_size)
    raise TypeError(f"no decoder for {type(model).__name__}; generation supports HyenaLM and Llama3")


def left_pad(
    prompt_ids: Sequence[int] | Sequence[Sequence[int]] | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
    """One prompt ([P] ids), a batch ([B, P]) or a list of prompts of any lengths >= 1 -> (tokens [B, P],
    valid [B, P] or None when nothing is padded, whether a single 1-D prompt was given).

    Shorter prompts are padded on the left (with token 0, masked out by `valid`), so every row's prompt
    ends at the same position and all rows then step together."""
    ragged = not isinstance(prompt_ids, torch.Tensor) and len(prompt_ids) > 0 and not isinstance(prompt_ids[0], int)
    if not ragged:
        tokens = torch.as_tensor(prompt_ids, dtype=torch.long)
        single = tokens.ndim == 1
        tokens = tokens.reshape(1, -1) if single else tokens
        if tokens.ndim != 2 or tokens.shape[1] == 0:
            raise ValueError(f"prompt_ids must be [P] or [B, P] with P >= 1, got shape {tuple(tokens.shape)}")
        return tokens, None, single
    lengths = [len(p) for p in prompt_ids]
    if min(lengths) == 0:
        raise ValueError(f"every prompt needs >= 1 token; prompt {lengths.index(0)} of {len(lengths)} is empty")
    width = max(lengths)
    tokens = torch.zeros(len(lengths), width, dtype=torch.long)
    valid = torch.zeros(len(lengths), width, dtype=torch.bool)
    for row, prompt in enumerate(prompt_ids):
        tokens[row, width - len(prompt) :] = torch.as_tensor(prompt, dtype=torch.long)
        valid[row, width - len(prompt) :] = True
    return tokens, None if bool(valid.all()) else valid, False


@torch.no_grad()
def generate(
    model: nn.Module,
    prompt_ids: Sequence[int] | Sequence[Sequence[int]] | torch.Tensor,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int = 0,
    strategy: str = "flash",
    eos_id: int | None = None,
) -> torch.Tensor:
    """Continue `prompt_ids` by up to `max_new_tokens` tokens: one prompt ([P] token ids) or a batch ([B, P],
    or a list of B prompts of any lengths >= 1, left-padded internally).

    Each row gets the tokens it would get alone: same logits up to rounding, and its own sampling
    generator seeded by `seed`. temperature 0 is greedy; otherwise tokens are sampled from
    softmax(logits / temperature) over the top_k most likely (None: all). strategy picks Hyena's
    long-convolution algorithm ("lazy", "eager", "flash"; Llama always uses its KV cache). Generation stops
    early once every row has produced eos_id (if given); a row that finished first keeps going meanwhile,
    so cut each row after its first eos_id. Returns the new tokens: [n] for a 1-D prompt, [B, n] for a batch.
    """
    prompt, valid, single = left_pad(prompt_ids)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
    device = next(model.parameters()).device
    prompt = prompt.to(device)
    valid = None if valid is None else valid.to(device)
    rows = prompt.shape[0]
    decoder = build_decoder(model, prompt.shape[1] + max_new_tokens, rows, strategy)
    generators = [torch.Generator(device=device).manual_seed(seed) for _ in range(rows)]
    logits = decoder.prefill(prompt, valid=valid)[:, -1]
    new_tokens = []
    done = torch.zeros(rows, dtype=torch.bool, device=device)
    for n in range(max_new_tokens):
        token = sample_next(logits, temperature, top_k, generators)
        new_tokens.append(token)
        if eos_id is not None:
            done |= token == eos_id
            if bool(done.all()):
                break
        if n + 1 < max_new_tokens:
            logits = decoder.step(token)
    out = torch.stack(new_tokens, dim=1)
    return out[0] if single else out
