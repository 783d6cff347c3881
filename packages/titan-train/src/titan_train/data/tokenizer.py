"""The tokenizer: a Hugging Face `tokenizers` file plus the BOS/EOS ids that frame each document.

`load_tokenizer(None)` gives the embedded 2048-token byte-level BPE trained on the King James Bible by
tools/build_default_data.py. Any other `tokenizer.json` (e.g. Llama 3's) works too: BOS/EOS are read from
a sibling `tokenizer_config.json` when there is one, else found among the usual special-token names.
"""

from __future__ import annotations

import importlib.resources
import json
from collections.abc import Sequence
from pathlib import Path

import tokenizers

__all__ = ["Tokenizer", "load_tokenizer"]

# Tried in order when no tokenizer_config.json names the tokens (Llama 3, Llama 2 / Mistral, GPT-2, Gemma).
_BOS_NAMES = ("<|begin_of_text|>", "<s>", "<|endoftext|>", "<bos>")
_EOS_NAMES = ("<|end_of_text|>", "</s>", "<|endoftext|>", "<eos>")


class Tokenizer:
    """Text <-> token ids. `encode` frames a document as BOS + tokens + EOS by default."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        self._tok = tokenizers.Tokenizer.from_file(self.path)
        bos_name, eos_name = _special_token_names(Path(self.path).parent)
        self.bos_id = self._special_id("BOS", bos_name, _BOS_NAMES)
        self.eos_id = self._special_id("EOS", eos_name, _EOS_NAMES)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, bos: bool = True, eos: bool = True) -> list[int]:
        # add_special_tokens=False: a file's own post-processor (Llama 3 adds BOS) must not add a second one.
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return self._frame(ids, bos, eos)

    def encode_batch(self, texts: Sequence[str], bos: bool = True, eos: bool = True) -> list[list[int]]:
        """Like `encode` per text; `tokenizers` spreads the batch over its thread pool."""
        encodings = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return [self._frame(e.ids, bos, eos) for e in encodings]

    def encoding(self, text: str) -> tokenizers.Encoding:
        """`text`'s ids with their character offsets, nothing added (as transformers encodes a rendered chat)."""
        return self._tok.encode(text, add_special_tokens=False)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def _frame(self, ids: list[int], bos: bool, eos: bool) -> list[int]:
        return ([self.bos_id] if bos else []) + ids + ([self.eos_id] if eos else [])

    def _special_id(self, role: str, configured: str | None, candidates: tuple[str, ...]) -> int:
        for name in (configured,) if configured else candidates:
            token_id = self._tok.token_to_id(name)
            if token_id is not None:
                return token_id
        tried = configured or ", ".join(candidates)
        raise ValueError(
            f"tokenizer {self.path} has no {role} token (looked for {tried}); "
            f"add one as a special token or set it in tokenizer_config.json"
        )

    def __repr__(self) -> str:
        return f"Tokenizer({self.path!r}, vocab_size={self.vocab_size}, bos_id={self.bos_id}, eos_id={self.eos_id})"


def load_tokenizer(path: str | Path | None = None) -> Tokenizer:
    """Load `model.tokenizer_path`: a tokenizer.json, a folder holding one (HF layout), or None/"" for the
    embedded KJV tokenizer."""
    if path is None or str(path) == "":
        embedded = importlib.resources.files("titan_train") / "assets" / "tokenizer.json"
        with importlib.resources.as_file(embedded) as file:
            return Tokenizer(file)
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise FileNotFoundError(
            f"model.tokenizer_path={str(path)!r}: no tokenizer file at {p}; give a tokenizer.json, "
            f"a folder holding one (Hugging Face layout), or leave it empty for the embedded KJV tokenizer"
        )
    return Tokenizer(p)


def _special_token_names(folder: Path) -> tuple[str | None, str | None]:
    """bos_token / eos_token from a Hugging Face tokenizer_config.json next to the tokenizer, if any."""
    config = folder / "tokenizer_config.json"
    if not config.is_file():
        return None, None
    data = json.loads(config.read_text(encoding="utf-8"))

    def name(value):  # either "<s>" or {"content": "<s>", ...}
        return value.get("content") if isinstance(value, dict) else value

    return name(data.get("bos_token")), name(data.get("eos_token"))
