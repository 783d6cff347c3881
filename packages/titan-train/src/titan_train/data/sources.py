"""Where documents come from: `training.dataset` (+ `training.dataset_path`) -> a document source.

    dataset = "kjv"          the embedded King James Bible, one document per chapter (the default)
    dataset = "text"         dataset_path = a .txt / .jsonl / .jsonl.gz file or a folder of them (files.py)
    dataset = "hf:<name>"    a Hugging Face dataset, needs `datasets` (hf.py)

A source is anything with a `name` and `documents(start)` yielding the text of documents start, start+1,
... in a fixed order. Indices are global over the whole dataset: sharding and resume are built on them.
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from titan_train.data.files import SUFFIXES, LocalFiles, is_supported
from titan_train.data.hf import INSTALL_HINT, HuggingFaceSource, datasets_installed

__all__ = ["DocumentSource", "EmbeddedCorpus", "resolve_dataset", "DEFAULT_DATASET"]

DEFAULT_DATASET = "kjv"
_CHOICES = (
    "'kjv' (the embedded King James Bible, default), 'text' (with training.dataset_path = a "
    ".txt/.jsonl/.jsonl.gz file or a folder of them) or 'hf:<name>' (a Hugging Face dataset)"
)


class DocumentSource(Protocol):
    name: str

    def documents(self, start: int = 0) -> Iterator[str]: ...


class EmbeddedCorpus:
    """The King James Bible shipped in titan_train/assets/kjv.jsonl.gz: 1189 chapters, 4.1 M characters."""

    name = "kjv"

    def __init__(self):
        self._texts: list[str] | None = None

    def documents(self, start: int = 0) -> Iterator[str]:
        if self._texts is None:
            asset = importlib.resources.files("titan_train") / "assets" / "kjv.jsonl.gz"
            with asset.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as f:
                self._texts = [json.loads(line)["text"] for line in f]
        return iter(self._texts[start:])


def resolve_dataset(dataset: str | None, dataset_path: str | None = None) -> DocumentSource:
    """Check `training.dataset` / `training.dataset_path` and return the source. Cheap: opens no data."""
    dataset = dataset or DEFAULT_DATASET
    if dataset == "kjv":
        if dataset_path:
            raise ValueError(
                f"training.dataset_path={dataset_path!r} is set but training.dataset='kjv' "
                f"is the embedded corpus and takes no path; set training.dataset='text' "
                f"to train on your files"
            )
        return EmbeddedCorpus()
    if dataset == "text":
        return _local_files(dataset_path)
    if dataset.startswith("hf:"):
        name, _, config = dataset[len("hf:") :].partition(":")
        if not name:
            raise ValueError(f"training.dataset={dataset!r} names no dataset; write hf:<name>, e.g. hf:allenai/c4:en")
        if not datasets_installed():
            raise ImportError(
                f"training.dataset={dataset!r} needs the Hugging Face `datasets` package, "
                f"which is not installed: {INSTALL_HINT}"
            )
        return HuggingFaceSource(name, config or None, dataset_path or None)
    raise ValueError(f"training.dataset={dataset!r} is not a known dataset; use {_CHOICES}")


def _local_files(dataset_path: str | None) -> LocalFiles:
    if not dataset_path:
        raise ValueError(
            "training.dataset='text' needs training.dataset_path: a .txt, .jsonl or .jsonl.gz file, or a folder of them"
        )
    path = Path(dataset_path).expanduser()
    if not path.exists():
        raise ValueError(f"training.dataset_path={dataset_path!r} does not exist")
    if path.is_file() and not is_supported(path):
        raise ValueError(
            f"training.dataset_path={dataset_path!r} is not a supported file; use one ending in "
            f"{', '.join(SUFFIXES)}, or a folder of such files"
        )
    source = LocalFiles(path)
    if not source.files:
        raise ValueError(f"training.dataset_path={dataset_path!r} is a folder with no {'/'.join(SUFFIXES)} files")
    return source
