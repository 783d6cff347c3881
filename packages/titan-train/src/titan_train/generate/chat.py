"""`titan-generate --chat`: a prompt as a user message rendered with the tokenizer folder's chat template, the
reply generated until the template's end of turn.

The prompt ids are those of transformers' `tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
add_generation_prompt=True)` (an optional system message first): the template rendered as transformers
renders it (titan_train.data.chat_template), the text encoded with nothing added.

The end of turn is any of: the tokenizer's EOS (tokenizer_config.json's eos_token, which chat models set to the
token that closes an assistant turn: Qwen3's <|im_end|>, Llama 3 Instruct's <|eot_id|>), and the ids of
`eos_token_id` (one or a list) in a generation_config.json beside the tokenizer or the checkpoint, as
transformers' generate stops at them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import torch

from titan_train.data.chat_template import ChatTemplate, load_chat_template
from titan_train.data.tokenizer import Tokenizer

__all__ = ["chat_prompt_ids", "end_of_turn_ids", "generate_replies", "load_chat_template_for", "until_end_of_turn"]

GENERATION_CONFIG = "generation_config.json"


def load_chat_template_for(tokenizer: Tokenizer) -> ChatTemplate:
    """The chat template of the tokenizer's folder (the embedded tokenizer's is titan_train/assets'), as the SFT
    data reads it; ValueError naming the folder and the fix when it has none."""
    return load_chat_template(Path(tokenizer.path).parent)


def chat_prompt_ids(template: ChatTemplate, tokenizer: Tokenizer, prompt: str, system: str = "") -> list[int]:
    """The ids of the user message `prompt` (after the system message, if any) and the assistant's header."""
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": prompt})
    text, _ = template.render(messages, add_generation_prompt=True)
    return list(tokenizer.encoding(text).ids)


def end_of_turn_ids(tokenizer: Tokenizer, folders: Iterable[str | Path]) -> list[int]:
    """The tokenizer's EOS, then generation_config.json's eos_token_id(s) from the first of `folders` that has
    the file (see the module docstring)."""
    ids = [tokenizer.eos_id]
    for folder in folders:
        path = Path(folder) / GENERATION_CONFIG
        if not path.is_file():
            continue
        listed = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
        listed = [listed] if isinstance(listed, int) else list(listed or [])
        ids += [token for token in listed if token not in ids]
        break
    return ids


def until_end_of_turn(tokens: Iterable[int], stop_ids: Sequence[int]) -> Iterator[int]:
    """`tokens` up to, not including, the first end-of-turn token: the reply alone."""
    for token in tokens:
        if token in stop_ids:
            return
        yield token


@torch.no_grad()
def generate_replies(
    model: torch.nn.Module,
    prompts: list[list[int]],
    max_new_tokens: int,
    options,
    stop_ids: Sequence[int],
    loop: Callable[..., Iterator[torch.Tensor]] | None = None,
) -> list[list[int]]:
    """Each prompt's reply (its tokens before the first end-of-turn token), the prompts generated as one batch
    that ends once every row has ended its turn. `options`: titan_models.generate.GenerationOptions; `loop`: the
    token loop, generate_tokens's signature (None: generate_tokens; titan-generate --speculative mtp gives
    speculative_tokens)."""
    from titan_models.generate import generate_tokens
    from titan_models.generate.loop import left_pad

    loop = generate_tokens if loop is None else loop

    tokens, valid, _ = left_pad(prompts)
    stop = torch.tensor(list(stop_ids))
    done = torch.zeros(len(prompts), dtype=torch.bool)
    steps = []
    for token in loop(model, tokens, max_new_tokens, options, valid):
        token = token.cpu()
        steps.append(token)
        done |= torch.isin(token, stop)
        if bool(done.all()):
            break
    rows = torch.stack(steps, dim=1).tolist()
    return [list(until_end_of_turn(row, stop_ids)) for row in rows]
