"""Speculative greedy decoding with a decoder's own multi-token prediction modules (DeepSeek-V3 section 2.2).

Each round the MTP modules draft up to D tokens past the main model's next one (mtp_draft.py); the main model
reads that token and the draft in one forward (D + 1 positions) and keeps the longest prefix of the draft that
equals its own greedy choices, plus its own token after that prefix. The output is therefore plain greedy
decoding's (generate(..., temperature=0)), token for token; what the draft changes is how many main forwards
it takes. (A model with sliding-window layers is refused: their rolling cache cannot drop a rejected draft; so is
one with linear-attention layers, whose recurrent state cannot either.)
The positions of a rejected draft are dropped from the main cache (LlamaDecoder.rewind) and recomputed
in the modules' caches at the next draft.

A batch accepts, each round, the shortest prefix any of its rows accepts, so every row stays exact and all rows
step together (a batch accepts less than its rows would alone).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from titan_models.decoder.model import Decoder
from titan_models.generate.llama_decode import LlamaDecoder
from titan_models.generate.loop import GenerationOptions, left_pad
from titan_models.generate.mtp_draft import MTPDrafter


@dataclass
class SpeculationStats:
    """What speculation did, counted over one generation (pass one in to read it afterwards): main_forwards, the
    forwards of the main model, the prompt's prefill included (plain decoding: one per new token); drafted, the
    tokens the MTP modules guessed, and accepted, those the main model confirmed (per row: a batch drafts and
    accepts as one); tokens, the new tokens produced per row."""

    main_forwards: int = 0
    drafted: int = 0
    accepted: int = 0
    tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_forward(self) -> float:
        """New tokens per main forward: 1 for plain decoding, up to D + 1 with every guess accepted."""
        return self.tokens / self.main_forwards if self.main_forwards else 0.0


def check_speculative(model: nn.Module, options: GenerationOptions) -> None:
    """ValueError naming what stops `model` and `options` from speculative decoding with the MTP modules."""
    if not isinstance(model, Decoder):
        raise ValueError(
            f"speculative decoding with MTP modules needs a decoder model (llama3, qwen3, deepseek_v3, ...), "
            f"not {type(model).__name__}"
        )
    linear = [i for i in range(model.args.n_layers) if model.args.is_linear_attention(i)]
    if linear:
        raise ValueError(
            f"speculative decoding with MTP modules cannot run on a model with linear-attention layers ({linear}): "
            "their recurrent state absorbs every token read and cannot roll a rejected draft back (not implemented); "
            "decode without speculation (titan-generate: drop --speculative mtp)"
        )
    if model.mtp is None:
        raise ValueError(
            "speculative decoding with MTP modules needs a model trained with them: this one has mtp_layers = 0 "
            "(train with model.mtp_layers = D > 0, or decode without speculation)"
        )
    windowed = [i for i in range(model.args.n_layers) if model.args.window_for(i) is not None]
    if windowed:
        raise ValueError(
            f"speculative decoding with MTP modules cannot run on a model with sliding-window layers ({windowed}, "
            f"sliding_window={model.args.sliding_window}): their rolling KV cache keeps only the window and "
            "cannot roll a rejected draft back; decode without speculation (titan-generate: drop --speculative mtp)"
        )
    if options.temperature != 0:
        raise ValueError(
            f"speculative decoding with MTP modules is greedy only (temperature 0); got temperature="
            f"{options.temperature}: sample without speculation, or decode greedily"
        )


@torch.no_grad()
def speculative_tokens(
    model: Decoder,
    prompt: torch.Tensor,
    max_new_tokens: int,
    options: GenerationOptions = GenerationOptions(),  # noqa: B008 (frozen: one shared default is safe)
    valid: torch.Tensor | None = None,
    stats: SpeculationStats | None = None,
) -> Iterator[torch.Tensor]:
    """generate_tokens() for greedy decoding, drafted by the MTP modules: the same tokens [B] one at a time, for
    the prompts [B, P] (`valid` False at left padding), stopping once every row has produced options.eos_id.
    `stats` (optional) is updated as tokens come."""
    check_speculative(model, options)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
    stats = SpeculationStats() if stats is None else stats
    device = model.output.weight.device
    prompt = prompt.to(device)
    rows, length = prompt.shape
    decoder = LlamaDecoder(model, length + max_new_tokens, rows)
    drafter = MTPDrafter(decoder)
    tokens = torch.zeros(rows, length + max_new_tokens, dtype=torch.long, device=device)
    tokens[:, :length] = prompt
    logits = decoder.prefill(prompt, valid=None if valid is None else valid.to(device))
    stats.main_forwards += 1
    drafter.observe(0, decoder.last_hidden)
    new = logits[:, -1:].argmax(dim=-1)  # [B, m]: this round's tokens
    last = length - 1  # the last position the main model has read; its prediction is tokens[:, last + 1]
    tokens[:, length] = new[:, 0]
    done = torch.zeros(rows, dtype=torch.bool, device=device)
    produced = 0
    while True:
        for token in new.unbind(dim=1):
            yield token
            produced += 1
            stats.tokens += 1
            if options.eos_id is not None:
                done |= token == options.eos_id
                if bool(done.all()):
                    return
            if produced == max_new_tokens:
                return
        # Never past max_new_tokens: a round yields at most n + 1 tokens.
        n = min(drafter.depth, max_new_tokens - produced - 1)
        draft = drafter.draft(tokens[:, : last + 2], last, n)
        logits = decoder.extend(torch.cat([tokens[:, last + 1 : last + 2], draft], dim=1))
        stats.main_forwards += 1
        drafter.observe(last + 1, decoder.last_hidden)
        greedy = logits.argmax(dim=-1)  # [B, n + 1]: the main model's token after each position read
        agreed = (draft == greedy[:, :n]).long().cumprod(dim=1).sum(dim=1)  # each row's accepted prefix
        accepted = int(agreed.min()) if n else 0
        stats.drafted += n
        stats.accepted += accepted
        new = greedy[:, : accepted + 1]  # the accepted guesses (equal to greedy's) and the main model's next
        tokens[:, last + 2 : last + 3 + accepted] = new
        last += accepted + 1
        decoder.rewind(last + 1)


@torch.no_grad()
def generate_speculative(
    model: Decoder,
    prompt_ids: Sequence[int] | Sequence[Sequence[int]] | torch.Tensor,
    max_new_tokens: int,
    eos_id: int | None = None,
    stats: SpeculationStats | None = None,
) -> torch.Tensor:
    """generate(model, prompt_ids, max_new_tokens, temperature=0, eos_id=eos_id), drafted by the model's MTP
    modules: the same tokens ([n] for a 1-D prompt, [B, n] for a batch), in fewer main forwards when the drafts
    are good. `stats` (optional): a SpeculationStats to fill (acceptance rate, tokens per main forward)."""
    prompt, valid, single = left_pad(prompt_ids)
    options = GenerationOptions(eos_id=eos_id)
    out = torch.stack(list(speculative_tokens(model, prompt, max_new_tokens, options, valid, stats)), dim=1)
    return out[0] if single else out
