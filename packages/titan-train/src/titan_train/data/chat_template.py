"""A model folder's chat template, rendered with Jinja as transformers renders it (utils/chat_template_utils.py),
so that the text, and the token ids made from it, are those of `tokenizer.apply_chat_template(messages)`.

The template is the folder's `chat_template.jinja` (transformers >= 4.43 writes it there) or the `chat_template`
of its `tokenizer_config.json` (a string, or a list of named templates: "default" is used). The environment is
transformers': sandboxed, trim_blocks, lstrip_blocks, the loopcontrols extension, `raise_exception`,
`strftime_now`, a `tojson` that escapes no HTML, and the `{% generation %}` tag that marks the assistant's text
(the spans `render` returns). The named special tokens of tokenizer_config.json (bos_token, eos_token, ...) are
passed in as transformers passes its `special_tokens_map`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["ChatTemplate", "load_chat_template"]

TEMPLATE_FILE, CONFIG_FILE = "chat_template.jinja", "tokenizer_config.json"
# transformers' special_tokens_map: the named special tokens a template may read.
_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")

Span = tuple[int, int]


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template's source, where it came from, and the special tokens it is rendered with."""

    source: str
    origin: str
    special_tokens: dict[str, str]

    @property
    def marks_generation(self) -> bool:
        """Whether the template marks the assistant's text with `{% generation %}` blocks."""
        return _GENERATION_BLOCK.search(self.source) is not None

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> tuple[str, list[Span]]:
        """The rendered text and the character spans of its `{% generation %}` blocks, in order."""
        template = _compile(self.source)
        blocks: list[str] = []
        spans: list[Span] = []
        with template.environment.track_generation(blocks, spans):
            blocks.extend(
                template.generate(
                    messages=messages,
                    tools=None,
                    documents=None,
                    add_generation_prompt=add_generation_prompt,
                    **self.special_tokens,
                )
            )
        return "".join(blocks), spans


def load_chat_template(folder: str | Path) -> ChatTemplate:
    """The chat template of the model folder (the one holding tokenizer.json); ValueError naming the folder and
    what to add when it has none."""
    folder = Path(folder)
    config_path = folder / CONFIG_FILE
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    special = {name: _token_text(config.get(name)) for name in _SPECIAL_TOKENS}
    special = {name: text for name, text in special.items() if text is not None}
    if (folder / TEMPLATE_FILE).is_file():
        return ChatTemplate((folder / TEMPLATE_FILE).read_text(encoding="utf-8"), str(folder / TEMPLATE_FILE), special)
    source = config.get("chat_template")
    if isinstance(source, list):  # [{"name": ..., "template": ...}]: transformers uses "default"
        named = {entry["name"]: entry["template"] for entry in source}
        if "default" not in named:
            raise ValueError(
                f"{config_path}: chat_template holds templates named {sorted(named)} and none is 'default'; name "
                "the one to train with 'default'"
            )
        source = named["default"]
    if not isinstance(source, str) or not source:
        raise ValueError(
            f"the model folder {str(folder)!r} (model.tokenizer_path) has no chat template: add a `chat_template` "
            f"to its {CONFIG_FILE} or a {TEMPLATE_FILE} file, as the model's Hugging Face repository has them"
        )
    return ChatTemplate(source, f"{config_path}:chat_template", special)


def _token_text(value: Any) -> str | None:
    """A special token of tokenizer_config.json: "<s>" or an AddedToken's {"content": "<s>", ...}."""
    return value.get("content") if isinstance(value, dict) else value


_GENERATION_TAG = "generation"
_GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")  # transformers' test for the tag


class _GenerationTracker(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: renders its body and, while tracking, records its character
    span in the text rendered so far (transformers' AssistantTracker)."""

    tags = {_GENERATION_TAG}

    def __init__(self, environment: jinja2.Environment):
        super().__init__(environment)
        environment.extend(track_generation=self.track_generation)
        self._blocks: list[str] | None = None
        self._spans: list[Span] | None = None

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_generation"), [], [], body).set_lineno(lineno)

    def _generation(self, caller: jinja2.runtime.Macro) -> str:
        text = caller()
        if self._blocks is not None and self._spans is not None:
            start = len("".join(self._blocks))
            self._spans.append((start, start + len(text)))
        return text

    def track_generation(self, blocks: list[str], spans: list[Span]):
        return _Tracking(self, blocks, spans)


class _Tracking:
    def __init__(self, tracker: _GenerationTracker, blocks: list[str], spans: list[Span]):
        self.tracker, self.blocks, self.spans = tracker, blocks, spans

    def __enter__(self) -> None:
        if self.tracker._blocks is not None:
            raise RuntimeError("a chat template renders one conversation at a time")
        self.tracker._blocks, self.tracker._spans = self.blocks, self.spans

    def __exit__(self, *exc) -> None:
        self.tracker._blocks = self.tracker._spans = None


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # Jinja's own tojson escapes HTML characters; transformers' (and so every template's expectation) does not.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict(...)` and `dict.fromkeys(...)` for templates, without handing them the dict type itself."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """transformers' namespace: no underscore-prefixed attributes (no reaching CPython internals)."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set {name!r} on a namespace")


def _environment() -> ImmutableSandboxedEnvironment:
    # Chat templates come from model repositories: untrusted code, hence the sandbox.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTracker, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, namespace=_Namespace)
    env.globals["dict"] = _TemplateDict()
    return env


_COMPILED: dict[str, jinja2.Template] = {}


def _compile(source: str) -> jinja2.Template:
    # One environment per template: the tracker lives on it.
    if source not in _COMPILED:
        _COMPILED[source] = _environment().from_string(source)
    return _COMPILED[source]
