"""Where documents come from: `training.dataset` (+ `training.dataset_path`) -> a document source.

    dataset = "kjv"          the embedded King James Bible, one document per chapter (the default)
    dataset = "text"         dataset_path = a .txt / .jsonl / .parquet file (.gz / .zst compressed), a folder of
                             them (files.py), or a folder written by `titan-data tokenize` (tokens.py)
    dataset = "hf:<name>"    a Hugging Face dataset, needs `datasets` (hf.py)
    dataset = "chat"         dataset_path = conversations, JSONL in the Hugging Face messages form (chat_files.py),
                             rendered with the model's chat template (chat_dataset.py); no path: 400 example
                             conversations about the embedded corpus
    dataset_mixture = [...]  several of these, weighted (mixture.py)

A source is anything with a `name` and `documents(start)` yielding documents start, start+1, ... in a fixed
order: texts, or arrays of token ids (pre-tokenized). Indices are global over the whole dataset: sharding
and resume are built on them.

`resolve_dataset` checks the config without opening data; `check_dataset` then reads the first record of
every file (cheap), so a missing field, an unreadable file or an empty dataset stops the run before it starts.
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from titan_train.data.chat_files import CHAT_SUFFIXES, EXAMPLE_CHATS, ChatFiles
from titan_train.data.dataset_keys import TRAINING_KEYS, DatasetKeys
from titan_train.data.files import SUFFIXES, LocalFiles, is_supported, missing_package
from titan_train.data.hf import INSTALL_HINT, HuggingFaceSource, datasets_installed
from titan_train.data.mixture import Mixture, parse_mixture
from titan_train.data.tokens import TokenFolder, is_token_folder

__all__ = ["DocumentSource", "EmbeddedCorpus", "resolve_dataset", "DEFAULT_DATASET"]

DEFAULT_DATASET = "kjv"
_CHOICES = (
    "'kjv' (the embedded King James Bible, default), 'text' (with training.dataset_path = a "
    ".txt/.jsonl/.parquet file, .gz or .zst compressed, a folder of them, or a folder written by "
    "`titan-data tokenize`), 'hf:<name>' (a Hugging Face dataset) or 'chat' (with training.dataset_path = "
    "conversations in JSONL, the Hugging Face messages form, or none for the shipped examples)"
)


class DocumentSource(Protocol):
    name: str

    def documents(self, start: int = 0) -> Iterator[Any]: ...


HELD_OUT_BOOKS = ("Ruth", "Esther", "Proverbs", "Ecclesiastes", "Song of Solomon", "Jonah", "Hebrews", "James")
"""Books of the embedded corpus kept for validation ("kjv_validation": 87 chapters, 64k tokens, at least one
8 x 256-token batch per rank on up to 16 data-parallel ranks); "kjv" never has them."""


class EmbeddedCorpus:
    """The King James Bible shipped in titan_train/assets/kjv.jsonl.gz: 1189 chapters, 4.1 M characters, one
    document per chapter. split "train" ("kjv") is every chapter but those of HELD_OUT_BOOKS; "validation"
    ("kjv_validation") is only those."""

    def __init__(self, split: str = "train"):
        self.split, self.name = split, "kjv" if split == "train" else "kjv_validation"
        self._texts: list[str] | None = None

    def documents(self, start: int = 0) -> Iterator[str]:
        if self._texts is None:
            asset = importlib.resources.files("titan_train") / "assets" / "kjv.jsonl.gz"
            with asset.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as f:
                rows = [json.loads(line) for line in f]
            held_out = self.split == "validation"
            self._texts = [r["text"] for r in rows if (r["id"].rpartition(" ")[0] in HELD_OUT_BOOKS) == held_out]
        return iter(self._texts[start:])


def resolve_dataset(
    dataset: str | None,
    dataset_path: str | None = None,
    text_field: str = "text",
    mixture: list[dict] | None = None,
    keys: DatasetKeys = TRAINING_KEYS,
) -> DocumentSource:
    """Check `training.dataset` / `dataset_path` / `dataset_text_field` / `dataset_mixture` and return the
    source. Cheap: opens no data (see check_dataset)."""
    if not isinstance(text_field, str) or not text_field:
        raise ValueError(f"{keys.text_field}={text_field!r} must name the field holding the text")
    if mixture:
        if dataset_path or (dataset or DEFAULT_DATASET) != DEFAULT_DATASET:
            raise ValueError(
                f"training.dataset_mixture is set, and so are training.dataset={dataset!r} / training.dataset_path="
                f"{dataset_path!r}; the mixture names its own sources: leave those two unset"
            )
        return Mixture(*parse_mixture(mixture, _resolve_one, text_field))
    return _resolve_one(dataset or DEFAULT_DATASET, dataset_path, text_field, keys)


def _resolve_one(
    dataset: str, dataset_path: str | None, text_field: str, keys: DatasetKeys = TRAINING_KEYS
) -> DocumentSource:
    if dataset == "kjv":
        if dataset_path:
            raise ValueError(
                f"{keys.path}={dataset_path!r} is set but {keys.dataset}='kjv' "
                f"is the embedded corpus and takes no path; set {keys.dataset}='text' "
                f"to train on your files"
            )
        return EmbeddedCorpus()
    if dataset == "kjv_validation" and not dataset_path:
        return EmbeddedCorpus("validation")
    if dataset == "text":
        return _local_files(dataset_path, text_field, keys)
    if dataset == "chat":
        return _chat_files(dataset_path, keys)
    if dataset.startswith("hf:"):
        name, _, config = dataset[len("hf:") :].partition(":")
        if not name:
            raise ValueError(f"{keys.dataset}={dataset!r} names no dataset; write hf:<name>, e.g. hf:allenai/c4:en")
        if not datasets_installed():
            raise ImportError(
                f"{keys.dataset}={dataset!r} needs the Hugging Face `datasets` package, "
                f"which is not installed: {INSTALL_HINT}"
            )
        return HuggingFaceSource(name, config or None, dataset_path or None, text_field)
    raise ValueError(f"{keys.dataset}={dataset!r} is not a known dataset; use {_CHOICES}")


def _chat_files(dataset_path: str | None, keys: DatasetKeys) -> DocumentSource:
    if not dataset_path:  # the example conversations shipped with titan-train (tools/build_chat_data.py)
        logging.getLogger("titan").info(
            f"{keys.dataset}='chat' without {keys.path}: the example conversations shipped with titan-train "
            f"({EXAMPLE_CHATS}); set {keys.path} to train on yours"
        )
        return ChatFiles(Path(str(importlib.resources.files("titan_train") / "assets" / EXAMPLE_CHATS)))
    source = ChatFiles(_existing(dataset_path, keys))
    if not source.files:
        raise ValueError(f"{keys.path}={dataset_path!r} holds no {'/'.join(CHAT_SUFFIXES)} file of conversations")
    return _readable(source, dataset_path, keys)


def _local_files(dataset_path: str | None, text_field: str, keys: DatasetKeys) -> DocumentSource:
    if not dataset_path:
        raise ValueError(
            f"{keys.dataset}='text' needs {keys.path}: a .txt, .jsonl or .parquet file (.gz/.zst "
            "compressed), a folder of them, or a folder written by `titan-data tokenize`"
        )
    path = _existing(dataset_path, keys)
    if is_token_folder(path):
        try:
            return TokenFolder(path)
        except ValueError as e:
            raise ValueError(f"{keys.path}={dataset_path!r}: {e}") from None
    if path.is_file() and not is_supported(path):
        raise ValueError(
            f"{keys.path}={dataset_path!r} is not a supported file; use one ending in "
            f"{', '.join(SUFFIXES)}, or a folder of such files"
        )
    source = LocalFiles(path, text_field)
    if not source.files:
        raise ValueError(f"{keys.path}={dataset_path!r} is a folder with no {'/'.join(SUFFIXES)} files")
    return _readable(source, dataset_path, keys)


def _existing(dataset_path: str, keys: DatasetKeys) -> Path:
    path = Path(dataset_path).expanduser()
    if not path.exists():
        raise ValueError(f"{keys.path}={dataset_path!r} does not exist")
    return path


def _readable(source: LocalFiles | ChatFiles, dataset_path: str, keys: DatasetKeys) -> DocumentSource:
    """`source`, or ImportError naming the optional package one of its files needs."""
    for file in source.files:
        if needed := missing_package(file):
            raise ImportError(f"{keys.path}={dataset_path!r}: reading {file} needs {needed[0]}: {needed[1]}")
    return source
