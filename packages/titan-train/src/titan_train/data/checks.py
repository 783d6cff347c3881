"""Checks of the data itself before training starts: what can be seen at step 0 must not stop step 5,000.

`check_dataset` opens every file of the dataset and reads its first record: an unreadable or undecodable
file, a missing text field (JSONL: the first record; Parquet: the schema, for every row), a dataset with no
documents, and pre-tokenized data made with another tokenizer than the trainer's are errors naming the config
key, the file and the line. A bad record deep inside a file shows only when it is read (the error then
names the file and line too); `titan-data check PATH` reads everything ahead of a run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from titan_train.data.chat_files import ChatFiles, read_conversations
from titan_train.data.files import LocalFiles, parquet_rows, parquet_text_column, read_file
from titan_train.data.mixture import Mixture
from titan_train.data.tokens import TokenFolder, file_sha256


def check_dataset(source: Any, tokenizer_path: str = "") -> None:
    """ValueError naming the config key, file and line of the first problem found (see module docstring)."""
    if isinstance(source, Mixture):
        for i, part in enumerate(source.sources):
            _check_one(part, tokenizer_path, f"training.dataset_mixture[{i}].path")
    else:
        _check_one(source, tokenizer_path, "training.dataset_path")


def _check_one(source: Any, tokenizer_path: str, key: str) -> None:
    where = f"{key}={source.name!r}"
    if isinstance(source, TokenFolder):
        if len(source) == 0:
            raise ValueError(f"{where}: the pre-tokenized data holds no documents")
        sha, vocab_size = tokenizer_fingerprint(tokenizer_path)
        try:
            source.check_tokenizer(sha, vocab_size, tokenizer_path)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    elif isinstance(source, ChatFiles):
        for path in source.files:
            try:
                next(read_conversations(path), None)
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
            except Exception as e:  # noqa: BLE001 - OSError, gzip/zstd decoding errors: all say "unreadable"
                raise ValueError(f"{where}: {path} cannot be read: {type(e).__name__}: {e}") from None
    elif isinstance(source, LocalFiles):
        if not any([_first_document_of(path, source.text_field, where) for path in source.files]):
            files = f"its {len(source.files)} files hold" if len(source.files) > 1 else "the file holds"
            raise ValueError(f"{where}: {files} no documents (an empty split)")


def _first_document_of(path: Path, text_field: str, where: str) -> bool:
    """Whether `path` holds a document; reads its first record (Parquet: its footer)."""
    try:
        if path.name.endswith(".parquet"):
            parquet_text_column(path, text_field)
            return parquet_rows(path) > 0
        return next(read_file(path, text_field), None) is not None
    except UnicodeDecodeError as e:
        raise ValueError(f"{where}: {path} is not UTF-8 text ({e})") from None
    except ValueError as e:
        if str(path) in str(e):  # ours: names the file and line already
            raise ValueError(f"{where}: {e}") from None
        raise ValueError(f"{where}: {path} cannot be read: {type(e).__name__}: {e}") from None
    except Exception as e:  # noqa: BLE001 - OSError, gzip/zstd/Parquet decoding errors: all say "unreadable"
        raise ValueError(f"{where}: {path} cannot be read: {type(e).__name__}: {e}") from None


def tokenizer_fingerprint(tokenizer_path: str) -> tuple[str, int]:
    """(sha256 of the tokenizer.json, vocabulary size) of `model.tokenizer_path` ("" : the embedded one)."""
    from titan_train.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_path or None)
    return file_sha256(tokenizer.path), tokenizer.vocab_size
