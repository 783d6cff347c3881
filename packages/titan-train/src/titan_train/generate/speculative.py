"""`titan-generate --speculative mtp`: greedy decoding drafted by the model's multi-token prediction modules
(titan_models.generate.mtp_speculative), its refusals and its figures.

The tokens are greedy decoding's; what changes is the number of forwards of the model. The figures: the
acceptance rate (drafted tokens the model confirmed) and the tokens per forward (1 without speculation, at most
the number of MTP modules + 1).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from titan_train.config import ConfigError

SPECULATION = ("mtp",)
"""The values --speculative takes (empty: none)."""


def check_speculative_options(options) -> None:
    """ConfigError for a --speculative the other options rule out, before any model is built (--chat and
    --batch-file are served);
    options: titan_train.cli.generate.GenerateOptions."""
    if not options.speculative:
        return
    if options.speculative not in SPECULATION:
        raise ConfigError(f"--speculative={options.speculative!r} is not allowed; use mtp (or leave it out)")
    if options.temperature != 0:
        raise ConfigError(
            f"--speculative mtp is greedy only, but --temperature={options.temperature}: drop --temperature "
            "(or give 0), or sample without --speculative"
        )


def check_speculative_model(model: torch.nn.Module, source: str):
    """A fresh SpeculationStats when `model` can draft with MTP modules; ConfigError naming the fix otherwise."""
    from titan_models.generate import SpeculationStats

    args = getattr(model, "args", None)
    linear = (
        [i for i in range(args.n_layers) if args.is_linear_attention(i)] if hasattr(args, "is_linear_attention") else []
    )
    if linear:
        raise ConfigError(
            f"--speculative mtp cannot run on {source}: its linear-attention layers {linear} keep a recurrent state "
            "that cannot roll a rejected draft back (not implemented); drop --speculative"
        )
    if getattr(model, "mtp", None) is None:
        depth = getattr(getattr(model, "args", None), "mtp_layers", None)
        has = "none (model.mtp_layers = 0)" if depth == 0 else "none (not a decoder family)"
        raise ConfigError(
            f"--speculative mtp needs a model with multi-token prediction modules, but {source} has {has}: "
            "give a model trained with model.mtp_layers > 0 (its recipe or checkpoint), or drop --speculative"
        )
    args = model.args
    windowed = [i for i in range(args.n_layers) if args.window_for(i) is not None]
    if windowed:
        raise ConfigError(
            f"--speculative mtp cannot run on {source}: its sliding-window layers {windowed} (sliding_window="
            f"{args.sliding_window}) keep a rolling KV cache of the window alone, which cannot roll a rejected draft "
            "back; drop --speculative"
        )
    return SpeculationStats()


@torch.no_grad()
def stream_speculative(
    model: torch.nn.Module, prompt_ids: Sequence[int], max_new_tokens: int, eos_id: int | None, stats
) -> Iterator[int]:
    """Like titan_train.generate.streaming.stream_tokens, greedy and drafted: up to max_new_tokens new ids,
    stopping after eos_id; `stats` (a SpeculationStats) counts as they come."""
    from titan_models.generate import GenerationOptions, speculative_tokens

    prompt = torch.as_tensor(list(prompt_ids), dtype=torch.long).reshape(1, -1)
    for token in speculative_tokens(model, prompt, max_new_tokens, GenerationOptions(eos_id=eos_id), stats=stats):
        yield int(token[0])


def speculation_line(stats, depth: int) -> str:
    """What speculation did (stats: a SpeculationStats), for stderr."""
    return (
        f"speculative mtp ({depth} MTP module(s)): acceptance {100 * stats.acceptance_rate:.1f}% "
        f"({stats.accepted} of {stats.drafted} drafted tokens), {stats.tokens_per_forward:.2f} tokens per forward "
        f"({stats.tokens} tokens in {stats.main_forwards} forwards of the model)"
    )
