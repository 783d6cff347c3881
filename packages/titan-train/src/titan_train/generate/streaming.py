"""Tokens printed as they are generated (titan-generate with one prompt).

`stream_tokens` is `titan_models.generate.generate` one token at a time (its loop, `generate_tokens`), so the
same seed gives the same tokens. `write_stream` prints the text they add as it grows,
holding back a piece that ends inside a UTF-8 character (byte-level tokens can split one).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TextIO

import torch


@torch.no_grad()
def stream_tokens(
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int = 0,
    strategy: str = "flash",
    eos_id: int | None = None,
) -> Iterator[int]:
    """Yield up to max_new_tokens new token ids for one prompt, stopping after eos_id."""
    from titan_models.generate import GenerationOptions, generate_tokens

    prompt = torch.as_tensor(list(prompt_ids), dtype=torch.long).reshape(1, -1)
    options = GenerationOptions(temperature, top_k, seed, strategy, eos_id)
    for token in generate_tokens(model, prompt, max_new_tokens, options):
        yield int(token[0])


def write_stream(tokens: Iterator[int], decode, out: TextIO) -> list[int]:
    """Write the text of `tokens` to `out` as each arrives (decode: ids -> text); returns the ids."""
    ids: list[int] = []
    written = ""
    for token in tokens:
        ids.append(token)
        text = decode(ids)
        if text.endswith("\ufffd"):
            continue  # the rest of a UTF-8 character is in the next token
        out.write(text[len(written) :])
        out.flush()
        written = text
    out.write(decode(ids)[len(written) :])
    out.flush()
    return ids
