"""DCP file storage with what plain torch.distributed.checkpoint does not promise (readers and writers in
dcp_files.py).

- Nothing loaded executes pickled code. DCP reads `.metadata` with `pickle.load` and non-tensor values with
  `torch.load(weights_only=False)`; here `.metadata` goes through an unpickler that admits only DCP's own
  metadata classes, and non-tensor values through `torch.load(weights_only=True)`. (DCP already reads
  tensors with weights_only=True.)
- Corruption is caught and names the file. Each rank records the size and CRC-32 of every file it writes
  while writing it (no second read); `verify_files` checks them on load. Checkpoints without recorded
  checksums (written by plain DCP) are still checked against the sizes `.metadata` implies.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, Metadata
from torch.distributed.checkpoint._traverse import set_element  # what DefaultLoadPlanner.load_bytes uses

from titan_checkpoint.dcp_files import (  # noqa: F401  (moved to dcp_files.py; re-exported for one minor version)
    METADATA_FILE,
    SIDECAR_SUFFIX,
    ChecksumWriter,
    FsspecChecksumWriter,
    SafeFileSystemReader,
    SafeFsspecReader,
    _Crc32Stream,
    read_metadata_file,
)
from titan_checkpoint.errors import CheckpointCorruptError
from titan_checkpoint.location import Location, as_location


def read_dcp_metadata(path: str | os.PathLike | Location) -> Metadata:
    """The DCP metadata of the checkpoint folder `path`, read without running pickled code."""
    return read_metadata_file(as_location(path))


def checkpoint_reader(path: str | os.PathLike | Location) -> SafeFileSystemReader | SafeFsspecReader:
    return as_location(path).dcp_reader()


class SafeLoadPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner whose non-tensor values are read with torch.load(weights_only=True)."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            obj = torch.load(value, weights_only=True)
        except Exception as e:
            raise CheckpointCorruptError(
                f"checkpoint value {fqn!r} cannot be loaded with torch.load(weights_only=True) "
                f"({type(e).__name__}: {e}); values must be tensors, numbers, strings, bytes, lists, tuples or dicts"
            ) from e
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


def checksum_writer(path: str | os.PathLike | Location) -> ChecksumWriter | FsspecChecksumWriter:
    return as_location(path).dcp_writer()


def collect_checksums(path: str | os.PathLike) -> dict[str, dict[str, int]]:
    """Merge (and remove) the per-rank checksum files of a finished save; adds `.metadata`'s own."""
    path = as_location(path)
    merged: dict[str, dict[str, int]] = {}
    sidecars = sorted(n for n, _ in path.list_dir() if n.startswith("__") and n.endswith(f"_{SIDECAR_SUFFIX}"))
    for name in sidecars:
        merged.update(json.loads(path.join(name).read_text()))
        path.join(name).remove()
    metadata = path.join(METADATA_FILE)
    merged[METADATA_FILE] = {"size": metadata.size(), "crc32": metadata.crc32()}
    return merged


def _sizes_from_metadata(metadata: Metadata) -> dict[str, int]:
    """The least size each data file must have: the end of the last item `.metadata` places in it."""
    sizes: dict[str, int] = {}
    for info in metadata.storage_data.values():
        end = info.offset + info.length
        sizes[info.relative_path] = max(sizes.get(info.relative_path, 0), end)
    return sizes


def verify_files(
    path: str | os.PathLike,
    metadata: Metadata,
    recorded: dict[str, dict[str, int]] | None,
    *,
    check_crc: bool = True,
    only: Iterable[str] | None = None,
) -> list[str]:
    """Problems with the files of checkpoint `path` (empty if none), each naming its file.

    recorded: {file: {"size", "crc32"}} as written by `collect_checksums`, or None for a plain DCP
    checkpoint (then only the sizes `.metadata` implies are checked). only: restrict to these file names
    (ranks split the reading between them).
    """
    path = as_location(path)
    needed = _sizes_from_metadata(metadata)
    names = sorted(set(needed) | set(recorded or ()))
    if only is not None:
        keep = set(only)
        names = [n for n in names if n in keep]
    problems = []
    for name in names:
        file = path.join(name)
        if not file.is_file():
            problems.append(f"{file} is missing")
            continue
        size = file.size()
        want = recorded.get(name) if recorded else None
        if want is None:
            if name in needed and size < needed[name]:
                problems.append(
                    f"{file} is truncated: {size} bytes, but {METADATA_FILE} places data up to byte {needed[name]}"
                )
            continue
        if size != want["size"]:
            problems.append(f"{file} is {size} bytes but {want['size']} were written; the file is truncated or altered")
        elif check_crc and file.crc32() != want["crc32"]:
            problems.append(f"{file} fails its CRC-32 check: its bytes differ from those written (corrupt file)")
    return problems


def data_files(path: str | os.PathLike, metadata: Metadata, recorded: dict | None) -> list[str]:
    """Every file name verify_files would look at, in a fixed order (to split among ranks)."""
    return sorted(set(_sizes_from_metadata(metadata)) | set(recorded or ()))
