"""Documents from local files, or a folder of them:

- `.txt` (`.txt.gz`, `.txt.zst`): documents are separated by one or more blank lines (so a book split into
  paragraphs shards over data-parallel ranks; put one document per file with no blank lines inside if you
  want whole files).
- `.jsonl` (`.jsonl.gz`, `.jsonl.zst`): one JSON object per line; its text field (`training.dataset_text_field`,
  default "text") is the document. Blank lines are skipped.
- `.parquet`: one document per row, the text field's column; streamed by row group and record batch, and a
  resume skips whole row groups by the file's metadata (needs pyarrow: `pip install 'titan-train[parquet]'`).
- a folder: every such file below it, recursively, in sorted path order; other files and dot-files are
  ignored.

`.zst` needs zstandard (`pip install 'titan-train[zstd]'`); a file of several zstd frames is read whole.
"""

from __future__ import annotations

import gzip
import importlib.util
import io
import json
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import IO

SUFFIXES = (".txt", ".txt.gz", ".txt.zst", ".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet")
_JSONL = (".jsonl", ".jsonl.gz", ".jsonl.zst")
# The optional package each suffix needs: (import name, pip hint).
_NEEDS = {
    ".zst": ("zstandard", "pip install zstandard  (or: pip install 'titan-train[zstd]')"),
    ".parquet": ("pyarrow", "pip install pyarrow  (or: pip install 'titan-train[parquet]')"),
}
_PARQUET_BATCH = 1024


def is_supported(path: Path) -> bool:
    return path.name.endswith(SUFFIXES) and not path.name.startswith(".")


def missing_package(path: Path) -> tuple[str, str] | None:
    """(package, install hint) if reading `path` needs an optional package that is not installed."""
    for suffix, (module, hint) in _NEEDS.items():
        if path.name.endswith(suffix) and importlib.util.find_spec(module) is None:
            return module, hint
    return None


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

    def __init__(self, root: str | Path, text_field: str = "text"):
        self.root = Path(root)
        self.name = str(root)
        self.text_field = text_field
        self.files = list_files(self.root)

    def documents(self, start: int = 0) -> Iterator[str]:
        """Documents in order from index `start`: files that say how many documents they hold (Parquet) are
        skipped by that count, earlier documents of other files are read and dropped."""
        for path in self.files:
            count = parquet_rows(path) if path.name.endswith(".parquet") else None
            if count is not None and start >= count:
                start -= count
                continue
            docs = read_file(path, self.text_field, start)
            if count is None:
                docs = _skip_counting(docs, start)
                start = yield from docs
            else:
                yield from docs
                start = 0


def _skip_counting(docs: Iterator[str], start: int):
    """Yields docs[start:]; returns how many of `start` were left to skip (the file had fewer)."""
    for doc in docs:
        if start:
            start -= 1
        else:
            yield doc
    return start


def read_file(path: Path, text_field: str = "text", start: int = 0) -> Iterator[str]:
    """The documents of one file; a Parquet file begins at row `start` (other formats ignore it)."""
    if path.name.endswith(".parquet"):
        yield from _parquet_documents(path, text_field, start)
        return
    with open_text(path) as f:
        if path.name.endswith(_JSONL):
            yield from _jsonl_documents(f, path, text_field)
        else:
            yield from _paragraphs(f)


def open_text(path: Path) -> IO[str]:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    if path.name.endswith(".zst"):
        import zstandard

        raw = open(path, "rb")  # noqa: SIM115 - closed with the wrapper
        # read_across_frames: files from `zstd` on concatenated inputs, or from pzstd, hold several frames.
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=True)
        return io.TextIOWrapper(io.BufferedReader(reader), encoding="utf-8")
    return open(path, encoding="utf-8")


def jsonl_text(line: str, path: Path, lineno: int, text_field: str) -> str:
    """The text field of one JSONL line, or a ValueError naming the file, the line and what is there."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{lineno}: not valid JSON ({e})") from None
    if not isinstance(record, dict):
        raise ValueError(f'{path}:{lineno}: expected a JSON object with a string field "{text_field}"')
    if text_field not in record:
        strings = [k for k, v in record.items() if isinstance(v, str)]
        hint = f"; its string fields: {', '.join(map(repr, strings))}" if strings else ""
        raise ValueError(
            f'{path}:{lineno}: the JSON object has no field "{text_field}" (training.dataset_text_field){hint}'
        )
    text = record[text_field]
    if not isinstance(text, str):
        raise ValueError(f'{path}:{lineno}: field "{text_field}" is {type(text).__name__}, expected a string')
    return text


def _jsonl_documents(lines: IO[str], path: Path, text_field: str) -> Iterator[str]:
    for lineno, line in enumerate(lines, 1):
        if line.strip():
            yield jsonl_text(line, path, lineno, text_field)


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


def parquet_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def parquet_text_column(path: Path, text_field: str) -> None:
    """Check from the file's footer that `text_field` is a string column (ValueError naming the file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pq.ParquetFile(path).schema_arrow
    if text_field not in schema.names:
        strings = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
        hint = f"; its string columns: {', '.join(map(repr, strings))}" if strings else ""
        raise ValueError(f'{path}: the Parquet file has no column "{text_field}" (training.dataset_text_field){hint}')
    kind = schema.field(text_field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or str(kind) == "string_view"):
        raise ValueError(f'{path}: column "{text_field}" is {kind}, expected strings')


def _parquet_documents(path: Path, text_field: str, start: int) -> Iterator[str]:
    import pyarrow.parquet as pq

    parquet_text_column(path, text_field)
    file = pq.ParquetFile(path)
    first_group, skipped = 0, 0  # whole row groups before `start`, skipped by the footer's row counts
    while first_group < file.num_row_groups and skipped + file.metadata.row_group(first_group).num_rows <= start:
        skipped += file.metadata.row_group(first_group).num_rows
        first_group += 1
    groups = range(first_group, file.num_row_groups)
    batches = file.iter_batches(batch_size=_PARQUET_BATCH, row_groups=groups, columns=[text_field])
    texts = (text for batch in batches for text in batch.column(0).to_pylist())
    for row, text in enumerate(islice(texts, start - skipped, None), start):
        if text is None:
            raise ValueError(f'{path}: row {row} (0-based) has no "{text_field}" (null)')
        yield text
