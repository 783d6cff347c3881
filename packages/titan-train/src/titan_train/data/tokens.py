"""Pre-tokenized data: a folder written by `titan-data tokenize` and read with no tokenization at all.

    tokens.bin    every document's token ids, concatenated, unframed (no BOS/EOS): little-endian uint16
                  when the vocabulary fits (<= 65536 ids), else uint32; memory-mapped when read
    offsets.bin   little-endian uint64, one more than the documents: document i is
                  tokens[offsets[i]:offsets[i + 1]], so any document is found in O(1)
    tokens.json   what the files hold (written last: a folder without it is an unfinished write) and the
                  tokenizer they were made with, which the trainer's must match

The packer frames each document as BOS + tokens + EOS with the trainer's tokenizer, as it frames text, so
the token stream is the one the same text would give.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

FORMAT, VERSION = "titan-tokens", 1
META, TOKENS, OFFSETS = "tokens.json", "tokens.bin", "offsets.bin"


def is_token_folder(path: Path) -> bool:
    return path.is_dir() and (path / META).is_file()


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<u4")


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class TokenFolder:
    """A document source whose documents are arrays of token ids (see the module docstring)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.name = str(root)
        self.meta = read_meta(self.root)
        self._tokens: np.ndarray | None = None
        self._offsets: np.ndarray | None = None

    def __len__(self) -> int:
        return self.meta["num_documents"]

    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        # Mapped on first use, in the reading process (a DataLoader worker maps its own).
        if self._tokens is None:
            n_tokens = self.meta["num_tokens"]
            dtype = np.dtype(self.meta["dtype"]).newbyteorder("<")
            self._tokens = (
                np.memmap(self.root / TOKENS, dtype=dtype, mode="r", shape=(n_tokens,))
                if n_tokens
                else np.zeros(0, dtype)
            )
            self._offsets = np.memmap(self.root / OFFSETS, dtype="<u8", mode="r", shape=(len(self) + 1,))
        return self._tokens, self._offsets

    def documents(self, start: int = 0) -> Iterator[np.ndarray]:
        tokens, offsets = self._arrays()
        for i in range(start, len(self)):
            yield tokens[offsets[i] : offsets[i + 1]]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tokens": None, "_offsets": None}  # workers map the files themselves

    def check_tokenizer(self, tokenizer_sha256: str, vocab_size: int, tokenizer_path: str) -> None:
        """ValueError unless the trainer's tokenizer is the one these tokens were made with."""
        meta = self.meta
        if meta["tokenizer_sha256"] != tokenizer_sha256:
            option = f" --tokenizer {tokenizer_path}" if tokenizer_path else ""
            raise ValueError(
                f"its tokens were made with another tokenizer ({meta['tokenizer']}, vocab {meta['vocab_size']}, "
                f"sha256 {meta['tokenizer_sha256'][:12]}) than model.tokenizer_path={tokenizer_path!r} (vocab "
                f"{vocab_size}, sha256 {tokenizer_sha256[:12]}); tokenize again: `titan-data tokenize{option} "
                f"{meta['source']} NEW_FOLDER`, or set model.tokenizer_path to the tokenizer it was made with"
            )


def read_meta(root: Path) -> dict:
    """tokens.json, checked against the sizes of the two binary files (ValueError naming the file)."""
    path = root / META
    try:
        meta = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read the pre-tokenized data's description ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} description (written by `titan-data tokenize`)")
    if meta.get("version") != VERSION:
        raise ValueError(f"{path}: {FORMAT} version {meta.get('version')}, this titan-train reads {VERSION}")
    itemsize = np.dtype(meta["dtype"]).itemsize
    for name, expected in ((TOKENS, meta["num_tokens"] * itemsize), (OFFSETS, (meta["num_documents"] + 1) * 8)):
        size = (root / name).stat().st_size if (root / name).is_file() else None
        if size != expected:
            raise ValueError(
                f"{root / name}: {'missing' if size is None else f'{size} bytes'}, {path} says {expected} bytes; "
                "the folder is damaged or was not written to the end: run `titan-data tokenize` again"
            )
    return meta


def write_token_folder(
    documents: Iterable[list[int]], out: Path, vocab_size: int, tokenizer_meta: dict, source: str
) -> dict:
    """Write `documents` (token id lists, unframed) to the folder `out` (made, must be empty or absent) and
    return its description. Streams: memory holds one batch of documents at a time."""
    out.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(vocab_size)
    offsets, total = [0], 0
    with open(out / TOKENS, "wb") as tokens_file, open(out / OFFSETS, "wb") as offsets_file:
        for ids in documents:
            np.asarray(ids, dtype=dtype).tofile(tokens_file)
            total += len(ids)
            offsets.append(total)
            if len(offsets) >= 1 << 16:
                np.asarray(offsets[:-1], dtype="<u8").tofile(offsets_file)
                offsets = offsets[-1:]
        np.asarray(offsets, dtype="<u8").tofile(offsets_file)
        num_documents = offsets_file.tell() // 8 - 1
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "dtype": dtype.name,
        "num_documents": num_documents,
        "num_tokens": total,
        "vocab_size": vocab_size,
        **tokenizer_meta,
        "source": source,
    }
    temporary = out / (META + ".partial")
    temporary.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(temporary, out / META)
    return meta
