"""Documents from local files: .txt, .jsonl (each optionally .gz), or a folder of them.

- `.txt`: documents are separated by one or more blank lines (so a book split into paragraphs shards over
  data-parallel ranks; put one document per file with no blank lines inside if you want whole files).
- `.jsonl`: one JSON object per line; its "text" field is the document. Blank lines are skipped.
- a folder: every such file below it, recursively, in sorted path order; other files and dot-files are
  ignored.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import IO

SUFFIXES = (".txt", ".txt.gz", ".jsonl", ".jsonl.gz")


def is_supported(path: Path) -> bool:
    return path.name.endswith(SUFFIXES) and not path.name.startswith(".")


def list_files(root: Path) -> list[Path]:
    """The data files at `root`: itself if a file, else the supported files below it in sorted order."""
    if root.is_file():
        return [root]
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and is_supported(p) and not any(part.startswith(".") for part in p.relative_to(root).parts)
    )


class LocalFiles:
    """A document source over local files (see module docstring for the formats)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.name = str(root)
        self.files = list_files(self.root)

    def documents(self, start: int = 0) -> Iterator[str]:
        """Documents in order from index `start` (earlier ones are read and dropped: files have no index)."""
        docs = (doc for path in self.files for doc in read_file(path))
        return islice(docs, start, None)


def read_file(path: Path) -> Iterator[str]:
    with _open_text(path) as f:
        if path.name.endswith((".jsonl", ".jsonl.gz")):
            yield from _jsonl_documents(f, path)
        else:
            yield from _paragraphs(f)


def _open_text(path: Path) -> IO[str]:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _jsonl_documents(lines: IO[str], path: Path) -> Iterator[str]:
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            text = json.loads(line)["text"]
        except (json.JSONDecodeError, TypeError, KeyError) as e:
            raise ValueError(
                f'{path}:{lineno}: expected a JSON object with a string field "text" ({type(e).__name__}: {e})'
            ) from None
        if not isinstance(text, str):
            raise ValueError(f'{path}:{lineno}: field "text" is {type(text).__name__}, expected a string')
        yield text


def _paragraphs(lines: IO[str]) -> Iterator[str]:
    paragraph: list[str] = []
    for line in lines:
        if line.strip():
            paragraph.append(line)
        elif paragraph:
            yield "".join(paragraph).rstrip("\n")
            paragraph = []
    if paragraph:
        yield "".join(paragraph).rstrip("\n")
