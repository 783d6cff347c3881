"""Chat rendering (titan_train.data.chat_encoding) against transformers' apply_chat_template on the same folder:
token ids equal, and the assistant masks equal return_assistant_tokens_mask=True, for a Qwen3-style and a
Llama-3-style template with {% generation %} blocks, multi-turn with a system prompt."""

import json
import shutil

import pytest
import tokenizers
import transformers

from hf_checks import TOKENIZER
from titan_train.data.chat_encoding import encode_chat
from titan_train.data.chat_template import load_chat_template
from titan_train.data.tokenizer import load_tokenizer

QWEN3_STYLE = (
    "{% for message in messages %}"
    "{% if message.role == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message.content }}{{ '<|im_end|>' }}{% endgeneration %}"
    "{{ '\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3_STYLE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' }}"
    "{% if message.role == 'assistant' %}"
    "{% generation %}{{ message.content | trim }}{{ '<|eot_id|>' }}{% endgeneration %}"
    "{% else %}"
    "{{ message.content | trim }}{{ '<|eot_id|>' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
STYLES = {
    # Qwen3's tokenizer_config.json has no BOS (null), as here.
    "qwen3": (QWEN3_STYLE, ["<|im_start|>", "<|im_end|>"], None, "<|im_end|>"),
    "llama3": (
        LLAMA3_STYLE,
        ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        "<|begin_of_text|>",
        "<|eot_id|>",
    ),
}
CONVERSATION = [
    {"role": "system", "content": "You answer from the King James Bible."},
    {"role": "user", "content": "Who built the ark?"},
    {"role": "assistant", "content": "Noah built the ark, as God commanded him."},
    {"role": "user", "content": "How many days did it rain?"},
    {"role": "assistant", "content": " Forty days and forty nights. "},
]


def model_folder(tmp_path, style: str):
    """A folder as a model's Hugging Face repository holds its tokenizer: the embedded BPE plus the template's
    special tokens (appended past its 2048 ids), and a tokenizer_config.json with the template."""
    template, specials, bos, eos = STYLES[style]
    tokenizer = tokenizers.Tokenizer.from_file(str(TOKENIZER))
    tokenizer.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in specials])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "chat_template": template,
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("style", sorted(STYLES))
@pytest.mark.parametrize("turns", [3, 5], ids=["one_answer", "two_answers"])
def test_ids_and_assistant_mask_equal_transformers(tmp_path, style, turns):
    folder = model_folder(tmp_path, style)
    messages = CONVERSATION[:turns]
    reference = transformers.AutoTokenizer.from_pretrained(folder)
    expected = reference.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = encode_chat(load_chat_template(folder), load_tokenizer(folder), messages)
    assert ids == list(expected["input_ids"])
    assert mask == list(expected["assistant_masks"])
    assert 0 < sum(mask) < len(mask)
    assert ids == list(reference.apply_chat_template(messages, tokenize=True, return_dict=False))


def test_the_debug_models_template_equals_transformers(tmp_path):
    """The template shipped with the embedded tokenizer (titan_train/assets/chat_template.jinja), in a folder as
    transformers saves one (tokenizer.json + chat_template.jinja)."""
    assets = TOKENIZER.parent
    for name in ("tokenizer.json", "chat_template.jinja"):
        shutil.copy(assets / name, tmp_path / name)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path)
    expected = reference.apply_chat_template(
        CONVERSATION, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = encode_chat(load_chat_template(assets), load_tokenizer(None), CONVERSATION)
    assert (ids, mask) == (list(expected["input_ids"]), list(expected["assistant_masks"]))
