"""Chat templates rendered as transformers renders them (data/chat_template.py) and the assistant mask
(data/chat_encoding.py). The equality with transformers' own apply_chat_template is checked in
integration/test_chat_template_hf.py (transformers is no dependency of titan-train)."""

import json
import shutil
from pathlib import Path

import pytest

from titan_train.data.chat_encoding import encode_chat
from titan_train.data.chat_template import load_chat_template
from titan_train.data.tokenizer import load_tokenizer

ASSETS = Path(load_tokenizer(None).path).parent
CONVERSATION = [
    {"role": "system", "content": "Answer from the Bible."},
    {"role": "user", "content": "Who built the ark?"},
    {"role": "assistant", "content": "Noah built it."},
    {"role": "user", "content": "How long did it rain?"},
    {"role": "assistant", "content": "Forty days and forty nights."},
]
# Llama-3's layout in text the embedded vocabulary spells; with and without {% generation %} blocks.
HEADERS = (
    "{{ bos_token }}{% for m in messages %}{{ m.role + ':\\n' }}"
    "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{{ eos_token }}{% endgeneration %}"
    "{% else %}{{ m.content + '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant:\\n' }}{% endif %}"
)
PLAIN = HEADERS.replace("{% generation %}", "").replace("{% endgeneration %}", "")


def model_folder(tmp_path: Path, template, **config) -> Path:
    shutil.copy(ASSETS / "tokenizer.json", tmp_path / "tokenizer.json")
    config = {"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|end_of_text|>"}, **config}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    return tmp_path


def encoded(folder: Path, messages=CONVERSATION):
    return encode_chat(load_chat_template(folder), load_tokenizer(folder), messages)


def test_renders_with_transformers_environment(tmp_path):
    template = (
        "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}\n"
        "  {{ m | tojson }}|{{ bos_token }}{{ eos_token }}\n"
        "{% endfor %}"
        "{% if messages | length > 4 %}{{ raise_exception('too long') }}{% endif %}"
    )
    text, spans = load_chat_template(model_folder(tmp_path, template)).render(CONVERSATION[:2])
    # trim_blocks + lstrip_blocks, loopcontrols, a tojson that escapes no HTML, the special tokens passed in.
    assert text == '  {"role": "user", "content": "Who built the ark?"}|<|begin_of_text|><|end_of_text|>\n'
    assert spans == []
    with pytest.raises(Exception, match="too long"):
        load_chat_template(tmp_path).render(CONVERSATION)


def test_generation_blocks_mark_the_assistant_turns(tmp_path):
    tok = load_tokenizer(None)
    ids, mask = encoded(model_folder(tmp_path, HEADERS))
    learned = tok.decode([i for i, m in zip(ids, mask, strict=True) if m], skip_special_tokens=False)
    assert learned == "Noah built it.<|end_of_text|>Forty days and forty nights.<|end_of_text|>"
    assert ids[0] == tok.bos_id and mask[0] == 0


def test_prefix_rule_without_generation_blocks_gives_the_same_mask(tmp_path):
    (tmp_path / "marked").mkdir()
    (tmp_path / "plain").mkdir()
    assert encoded(model_folder(tmp_path / "plain", PLAIN)) == encoded(model_folder(tmp_path / "marked", HEADERS))


def test_a_template_that_rewrites_earlier_turns_is_refused(tmp_path):
    # Shows the turn count at the top: every later turn changes the rendering's start.
    template = "{{ messages | length }}" + PLAIN
    with pytest.raises(ValueError, match=r"not prefix-stable.*\{% generation %\}"):
        encoded(model_folder(tmp_path, template))


def test_templates_are_found_where_transformers_looks(tmp_path):
    folder = model_folder(tmp_path, [{"name": "default", "template": "d"}, {"name": "tool_use", "template": "t"}])
    assert load_chat_template(folder).source == "d"
    (folder / "chat_template.jinja").write_text("j")
    assert load_chat_template(folder).source == "j"
    assert "generation" in load_chat_template(ASSETS).source  # the debug model's, shipped with the tokenizer


def test_a_folder_without_template_names_the_fix(tmp_path):
    shutil.copy(ASSETS / "tokenizer.json", tmp_path / "tokenizer.json")
    with pytest.raises(ValueError, match=r"has no chat template: add a `chat_template` to its tokenizer_config"):
        load_chat_template(tmp_path)
