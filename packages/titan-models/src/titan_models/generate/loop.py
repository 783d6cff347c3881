"""generate(): a prompt in, new tokens out, for any registered model family with a decoder."""

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


@torch.no_grad()
def generate(
    model: nn.Module,
    prompt_ids: Sequence[int] | torch.Tensor,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int = 0,
    strategy: str = "flash",
    eos_id: int | None = None,
) -> torch.Tensor:
    """Continue `prompt_ids` ([P] or [B, P] token ids, P >= 1) by up to `max_new_tokens` tokens.

    temperature 0 is greedy; otherwise tokens are sampled from softmax(logits / temperature) over the top_k
    most likely (None: all), with a generator seeded by `seed` (same seed, same tokens). strategy picks
    Hyena's long-convolution algorithm ("lazy", "eager", "flash"; Llama always uses its KV cache).
    Generation stops early once every sequence has produced eos_id (if given).
    Returns the new tokens: [n] for a 1-D prompt, [B, n] for a batch.
    """
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long)
    single = prompt.ndim == 1
    prompt = prompt.reshape(1, -1) if single else prompt
    if prompt.ndim != 2 or prompt.shape[1] == 0:
        raise ValueError(f"prompt_ids must be [P] or [B, P] with P >= 1, got shape {tuple(prompt.shape)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
    device = next(model.parameters()).device
    prompt = prompt.to(device)
    decoder = build_decoder(model, prompt.shape[1] + max_new_tokens, prompt.shape[0], strategy)
    generator = torch.Generator(device=device).manual_seed(seed)
    logits = decoder.prefill(prompt)[:, -1]
    new_tokens = []
    done = torch.zeros(prompt.shape[0], dtype=torch.bool, device=device)
    for n in range(max_new_tokens):
        token = sample_next(logits, temperature, top_k, generator)
        new_tokens.append(token)
        if eos_id is not None:
            done |= token == eos_id
            if bool(done.all()):
                break
        if n + 1 < max_new_tokens:
            logits = decoder.step(token)
    out = torch.stack(new_tokens, dim=1)
    return out[0] if single else out
