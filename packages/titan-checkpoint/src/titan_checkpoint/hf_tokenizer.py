"""The tokenizer side of a Hugging Face export: its files, the ids of its BOS and EOS tokens, and
generation_config.json, so `AutoTokenizer` / `generate()` (and vLLM, TGI) behave as training did.

- The user's tokenizer_config.json (and special_tokens_map.json, generation_config.json) are copied byte for
  byte; without one, a complete tokenizer_config.json is written (bos/eos, the model's context length,
  the special tokens, no clean-up of spaces so decoding equals training's).
- tokenizer.json is copied as is when it has a post-processor (Llama 3's adds BOS). One without gets a
  TemplateProcessing that prepends BOS, in the exported copy only: training frames documents as BOS + text
  (+ EOS) itself, so `AutoTokenizer(text)` must give BOS + text to match.
Plain JSON: no tokenizer library is needed to export.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from titan_checkpoint.errors import CheckpointError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model")
# Kept from the tokenizer's folder as they are: they belong to the model the tokenizer came with.
KEPT_AS_IS = ("tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "generation_config.json")
# Tried in order when no tokenizer_config.json names the tokens (Llama 3, Llama 2 / Mistral, GPT-2, Gemma);
# the same order titan-train's tokenizer uses.
BOS_NAMES = ("<|begin_of_text|>", "<s>", "<|endoftext|>", "<bos>")
EOS_NAMES = ("<|end_of_text|>", "</s>", "<|endoftext|>", "<eos>")
# Llama 3 chat turns end with these; generation should stop at them too.
EXTRA_STOP_NAMES = ("<|eom_id|>", "<|eot_id|>")
# Llama 3.1's published sampling defaults.
SAMPLING_DEFAULTS = {"do_sample": True, "temperature": 0.6, "top_p": 0.9}


def _tokenizer_files(source: Path) -> dict[str, Path]:
    """name in the export -> file, for a tokenizer.json / tokenizer.model file or a folder of tokenizer files.
    A tokenizer.json given as a file brings its folder's other tokenizer files with it."""
    if source.is_file() and source.name != "tokenizer.json":
        return {("tokenizer.model" if source.suffix == ".model" else "tokenizer.json"): source}
    folder = source.parent if source.is_file() else source
    files = {name: folder / name for name in (*TOKENIZER_FILES, "generation_config.json") if (folder / name).is_file()}
    if not any(name in files for name in TOKENIZER_FILES):
        raise CheckpointError(
            f"tokenizer={str(source)!r}: no tokenizer file there (looked for {', '.join(TOKENIZER_FILES)})"
        )
    return files


def _read_json(file: Path) -> dict[str, Any]:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{file} cannot be read as JSON ({type(e).__name__}: {e})") from e


def _token_name(value: Any) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def _token_ids(tokenizer: dict[str, Any]) -> dict[str, int]:
    model = tokenizer.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    ids = dict(vocab) if isinstance(vocab, dict) else {}  # Unigram models list [token, score] pairs instead
    ids.update({t["content"]: t["id"] for t in tokenizer.get("added_tokens", [])})
    return ids


class ExportedTokenizer:
    """The tokenizer files to export and what config.json / generation_config.json need from them."""

    def __init__(self, source: str | os.PathLike):
        self.source = Path(source)
        self.files = _tokenizer_files(self.source)
        self.config = _read_json(self.files["tokenizer_config.json"]) if "tokenizer_config.json" in self.files else {}
        self.tokenizer = _read_json(self.files["tokenizer.json"]) if "tokenizer.json" in self.files else None
        ids = _token_ids(self.tokenizer) if self.tokenizer is not None else {}
        self.bos = self._find(ids, "bos_token", BOS_NAMES)
        self.eos = self._find(ids, "eos_token", EOS_NAMES)
        self.bos_id = None if self.bos is None else ids[self.bos]
        stops = [self.eos, *(name for name in EXTRA_STOP_NAMES if name != self.eos)]
        self.stop_ids = [ids[name] for name in stops if name in ids]

    def _find(self, ids: dict[str, int], key: str, candidates: tuple[str, ...]) -> str | None:
        configured = _token_name(self.config.get(key))
        for name in (configured,) if configured else candidates:
            if name in ids:
                return name
        return None

    @property
    def eos_token_id(self) -> int | list[int] | None:
        """One id, or the list generation stops at (Llama 3.1: end of text, end of message, end of turn)."""
        if not self.stop_ids:
            return None
        return self.stop_ids[0] if len(self.stop_ids) == 1 else self.stop_ids

    def generation_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"bos_token_id": self.bos_id, "eos_token_id": self.eos_token_id}
        return {**{k: v for k, v in config.items() if v is not None}, **SAMPLING_DEFAULTS}

    def write(self, out: Path, model_max_length: int) -> None:
        """The tokenizer files, and generation_config.json, into `out`."""
        for name in KEPT_AS_IS:
            if name in self.files:
                shutil.copyfile(self.files[name], out / name)
        if "generation_config.json" not in self.files:
            (out / "generation_config.json").write_text(json.dumps(self.generation_config(), indent=2) + "\n")
        if self.tokenizer is None:
            return
        if self.tokenizer.get("post_processor") is None and self.bos is not None:
            tokenizer = {**self.tokenizer, "post_processor": self._bos_post_processor()}
            (out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False, indent=2))
        else:
            shutil.copyfile(self.files["tokenizer.json"], out / "tokenizer.json")
        if "tokenizer_config.json" not in self.files:
            config = self._complete_tokenizer_config(model_max_length)
            (out / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2) + "\n")

    def _bos_post_processor(self) -> dict[str, Any]:
        """Llama 3's template: BOS before each sequence."""

        def bos(type_id: int) -> dict[str, Any]:
            return {"SpecialToken": {"id": self.bos, "type_id": type_id}}

        def text(name: str, type_id: int) -> dict[str, Any]:
            return {"Sequence": {"id": name, "type_id": type_id}}

        return {
            "type": "TemplateProcessing",
            "single": [bos(0), text("A", 0)],
            "pair": [bos(0), text("A", 0), bos(1), text("B", 1)],
            "special_tokens": {self.bos: {"id": self.bos, "ids": [self.bos_id], "tokens": [self.bos]}},
        }

    def _complete_tokenizer_config(self, model_max_length: int) -> dict[str, Any]:
        added = {
            str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
            for t in self.tokenizer.get("added_tokens", [])
        }
        config: dict[str, Any] = {
            "added_tokens_decoder": added,
            "bos_token": self.bos,
            "eos_token": self.eos,
            "clean_up_tokenization_spaces": False,
            "model_input_names": ["input_ids", "attention_mask"],
            "model_max_length": model_max_length,
            "tokenizer_class": "PreTrainedTokenizerFast",
        }
        return {k: v for k, v in config.items() if v is not None}
