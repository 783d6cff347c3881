"""generate(): prompts in, new tokens out, for any registered model family with a decoder; generate_tokens(): the
same loop, one step's tokens at a time (what a streaming caller reads)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from titan_models.decoder.model import Decoder
from titan_models.generate.hyena_decode import HyenaDecoder
from titan_models.generate.llama_decode import LlamaDecoder
from titan_models.generate.sampling import sample_next
from titan_models.hyena.model import HyenaLM


def build_decoder(
    model: nn.Module, max_len: int, batch_size: int = 1, strategy: str = "flash"
) -> HyenaDecoder | LlamaDecoder:
    """The incremental decoder for `model`: a KV cache for the decoder (Llama 3, Qwen3, ...), online long
    convolutions for Hyena (strategy "lazy", "eager" or "flash"; the KV cache ignores it)."""
    if isinstance(model, HyenaLM):
        return HyenaDecoder(model, max_len, strategy=strategy, batch_size=batch_size)
    if isinstance(model, Decoder):
        return LlamaDecoder(model, max_len, batch_size=batch_size)
    raise TypeError(f"no decoder for {type(model).__name__}; generation supports HyenaLM and Decoder (Llama3)")


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
    options = GenerationOptions(temperature, top_k, seed, strategy, eos_id)
    out = torch.stack(list(generate_tokens(model, prompt, max_new_tokens, options, valid)), dim=1)
    return out[0] if single else out


@dataclass(frozen=True)
class GenerationOptions:
    """How generation picks each token and when it stops: generate()'s keyword arguments of the same names."""

    temperature: float = 0.0
    top_k: int | None = None
    seed: int = 0
    strategy: str = "flash"
    eos_id: int | None = None


@torch.no_grad()
def generate_tokens(
    model: nn.Module,
    prompt: torch.Tensor,
    max_new_tokens: int,
    options: GenerationOptions = GenerationOptions(),  # noqa: B008 (frozen: one shared default is safe)
    valid: torch.Tensor | None = None,
) -> Iterator[torch.Tensor]:
    """generate()'s loop: yields each step's new tokens [B] for the prompts [B, P] (token ids; `valid` [B, P]
    False at left padding), up to max_new_tokens steps, stopping once every row has produced options.eos_id."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
    device = next(model.parameters()).device
    prompt = prompt.to(device)
    valid = None if valid is None else valid.to(device)
    rows = prompt.shape[0]
    decoder = build_decoder(model, prompt.shape[1] + max_new_tokens, rows, options.strategy)
    generators = [torch.Generator(device=device).manual_seed(options.seed) for _ in range(rows)]
    logits = decoder.prefill(prompt, valid=valid)[:, -1]
    done = torch.zeros(rows, dtype=torch.bool, device=device)
    for n in range(max_new_tokens):
        token = sample_next(logits, options.temperature, options.top_k, generators)
        yield token
        if options.eos_id is not None:
            done |= token == options.eos_id
            if bool(done.all()):
                return
        if n + 1 < max_new_tokens:
            logits = decoder.step(token)
