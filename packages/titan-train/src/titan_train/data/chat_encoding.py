"""A conversation -> token ids and the assistant mask (1 on the tokens the loss learns).

The ids are the rendered template's text encoded with no special tokens added, as
`tokenizer.apply_chat_template(messages, tokenize=True)` makes them. The mask:

- templates with `{% generation %}` blocks: transformers' `return_assistant_tokens_mask=True`, exactly: each
  block's first and last characters mapped to their tokens, and every token between them set.
- templates without: assistant turn i is the text that rendering messages[:i+1] adds to rendering messages[:i]
  with the generation prompt (the assistant header), i.e. the assistant's content and the template's
  end-of-turn text after it; its characters are mapped to tokens the same way. This needs a prefix-stable
  template (each such rendering a prefix of the whole conversation's); a template that rewrites earlier turns
  (e.g. drops the reasoning of all but the last assistant turn) raises, naming the fix: `{% generation %}` blocks.
"""

from __future__ import annotations

from typing import Any

from titan_train.data.chat_template import ChatTemplate, Span
from titan_train.data.tokenizer import Tokenizer

__all__ = ["encode_chat"]


def encode_chat(
    template: ChatTemplate, tokenizer: Tokenizer, messages: list[dict[str, Any]]
) -> tuple[list[int], list[int]]:
    """(token ids, assistant mask) of a conversation, lists of the same length."""
    # transformers drops the keys whose value is None (content=None from APIs) before rendering.
    messages = [{key: value for key, value in m.items() if value is not None} for m in messages]
    text, spans = template.render(messages)
    if not template.marks_generation:
        spans = _assistant_spans(template, messages, text)
    encoding = tokenizer.encoding(text)
    return list(encoding.ids), _token_mask(encoding, spans)


def _assistant_spans(template: ChatTemplate, messages: list[dict[str, Any]], text: str) -> list[Span]:
    spans = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        before, _ = template.render(messages[:i], add_generation_prompt=True)
        through, _ = template.render(messages[: i + 1])
        if not (through.startswith(before) and text.startswith(through)):
            raise ValueError(
                f"the chat template ({template.origin}) is not prefix-stable: rendering the conversation up to "
                f"assistant turn {i} is not a prefix of rendering all of it, so the assistant's tokens cannot be "
                "told from the rest; mark them with {% generation %}...{% endgeneration %} in the template "
                "(as transformers' return_assistant_tokens_mask needs)"
            )
        spans.append((len(before), len(through)))
    return spans


def _token_mask(encoding, spans: list[Span]) -> list[int]:
    """transformers' mapping of character spans to tokens (apply_chat_template, return_assistant_tokens_mask)."""
    mask = [0] * len(encoding.ids)
    for start_char, end_char in spans:
        start = encoding.char_to_token(start_char)
        end = encoding.char_to_token(end_char - 1)
        if start is None:
            break
        # `if end` as transformers has it: a span ending in token 0 (or in no token) runs to the end.
        for token in range(start, end + 1 if end else len(mask)):
            mask[token] = 1
    return mask
