"""DCP file storage with what plain torch.distributed.checkpoint does not promise.

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
import pickle
import threading
import warnings
import zlib
from collections.abc import Iterable
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed.checkpoint.metadata as dcp_metadata
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader, FileSystemWriter, Metadata

try:  # torch 2.15 makes the module public (deprecating the private one); its FileSystem stays private
    from torch.distributed.checkpoint.fsspec_filesystem import FsspecReader, FsspecWriter
    from torch.distributed.checkpoint.fsspec_filesystem import _FileSystem as FsspecFileSystem
except ImportError:  # torch 2.13, 2.14
    from torch.distributed.checkpoint._fsspec_filesystem import FileSystem as FsspecFileSystem
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint._traverse import set_element  # what DefaultLoadPlanner.load_bytes uses
from torch.distributed.checkpoint.filesystem import FileSystem

import titan_checkpoint.location as loc
from titan_checkpoint.errors import CheckpointCorruptError
from titan_checkpoint.location import Location, as_location

METADATA_FILE = ".metadata"
_SIDECAR_SUFFIX = "checksums.json"

# Single-process saves and loads pass no_dist=True on purpose; DCP warns about it on every call.
warnings.filterwarnings("ignore", message="torch.distributed is (disabled, )?unavailable or uninitialized, assuming")


class _MetadataUnpickler(pickle.Unpickler):
    """Admits the classes a DCP `.metadata` file is made of, and nothing that could run code."""

    _ALLOWED = {
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),  # maps a layout name to torch.strided etc.
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("pathlib", "PosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib", "PureWindowsPath"),
        ("collections", "OrderedDict"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if module == dcp_metadata.__name__ and isinstance(getattr(dcp_metadata, name, None), type):
            return getattr(dcp_metadata, name)
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP checkpoint metadata; refusing to load it")


def read_dcp_metadata(path: str | os.PathLike) -> Metadata:
    """The DCP metadata of the checkpoint folder `path`, read without running pickled code."""
    file = loc.join(as_location(path), METADATA_FILE)
    if not loc.is_file(file):
        raise CheckpointCorruptError(f"{file} is missing: {path} is not a complete DCP checkpoint")
    try:
        with loc.open_file(file, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except Exception as e:
        raise CheckpointCorruptError(
            f"{file} cannot be read ({type(e).__name__}: {e}); the checkpoint metadata is corrupt or truncated"
        ) from e
    if not isinstance(metadata, Metadata):
        raise CheckpointCorruptError(f"{file} holds a {type(metadata).__name__}, not DCP Metadata")
    return metadata


class _SafeReading:
    """Over a DCP reader: reads `.metadata` safely (once) and names the files when reading fails."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(os.fspath(path))
        self._metadata: Metadata | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self._metadata is None:
            self._metadata = read_dcp_metadata(self.path)
        if self._metadata.storage_meta is not None:
            self._metadata.storage_meta.load_id = self.load_id
        return self._metadata

    def read_data(self, plan, planner):
        try:
            return super().read_data(plan, planner)
        except Exception as e:
            folder = as_location(self.path)
            files = sorted(
                {str(loc.join(folder, self.storage_data[item.storage_index].relative_path)) for item in plan.items}
            )
            raise CheckpointCorruptError(
                f"reading {', '.join(files)} failed ({type(e).__name__}: {e}); the checkpoint is corrupt or truncated"
            ) from e


class SafeFileSystemReader(_SafeReading, FileSystemReader):
    """A local checkpoint's reader."""


class SafeFsspecReader(_SafeReading, FsspecReader):
    """An object-store checkpoint's reader (fsspec)."""


def checkpoint_reader(path: Location) -> SafeFileSystemReader | SafeFsspecReader:
    path = as_location(path)
    return SafeFileSystemReader(path) if loc.atomic_rename(path) else SafeFsspecReader(path)


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


class _Crc32Stream:
    """A write-only file that keeps the CRC-32 and length of what went through it."""

    def __init__(self, raw: io.IOBase):
        self.raw, self.crc, self.size = raw, 0, 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self.crc = zlib.crc32(view, self.crc)
        self.size += view.nbytes
        return self.raw.write(view)

    def tell(self) -> int:
        return self.raw.tell()

    def fileno(self) -> int:
        return self.raw.fileno()

    def flush(self) -> None:
        self.raw.flush()

    def close(self) -> None:
        self.raw.close()

    def writable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return self.raw.closed


class _Checksumming:
    """Over a DCP FileSystem: records the size and CRC-32 of each file written, while writing it."""

    def __init__(self):
        super().__init__()
        self.checksums: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()  # DCP may write files from several threads

    @contextmanager
    def create_stream(self, path, mode: str):
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with super().create_stream(path, mode) as raw:
            stream = _Crc32Stream(raw)
            yield stream
        with self._lock:
            self.checksums[os.path.basename(os.fspath(path))] = {"size": stream.size, "crc32": stream.crc}


class _ChecksummingFileSystem(_Checksumming, FileSystem):
    pass


class _ChecksummingFsspecFileSystem(_Checksumming, FsspecFileSystem):
    pass


class _ChecksumWriting:
    """Over a DCP writer: leaves `__<rank>_checksums.json` (size and CRC-32 of each file this rank wrote)
    beside its data files; `collect_checksums` merges them once every rank has finished."""

    def write_data(self, plan, planner):
        future = super().write_data(plan, planner)
        future.wait()
        prefix = plan.storage_data.prefix
        mine = {name: c for name, c in self.fs.checksums.items() if name.startswith(prefix)}
        loc.write_json(loc.join(as_location(self.path), f"{prefix}{_SIDECAR_SUFFIX}"), mine)
        return future


class ChecksumWriter(_ChecksumWriting, FileSystemWriter):
    """A local checkpoint's writer."""

    def __init__(self, path: str | os.PathLike, **kwargs: Any):
        super().__init__(path, **kwargs)
        self.fs = _ChecksummingFileSystem()


class FsspecChecksumWriter(_ChecksumWriting, FsspecWriter):
    """An object-store checkpoint's writer (fsspec). No fsync: an object exists once its upload completes."""

    def __init__(self, path: str, **kwargs: Any):
        super().__init__(path, sync_files=False, **kwargs)
        filesystem = _ChecksummingFsspecFileSystem()
        self.path = filesystem.init_path(path)
        self.fs = filesystem


def checksum_writer(path: Location) -> ChecksumWriter | FsspecChecksumWriter:
    path = as_location(path)
    return ChecksumWriter(path) if loc.atomic_rename(path) else FsspecChecksumWriter(path)


def collect_checksums(path: str | os.PathLike) -> dict[str, dict[str, int]]:
    """Merge (and remove) the per-rank checksum files of a finished save; adds `.metadata`'s own."""
    path = as_location(path)
    merged: dict[str, dict[str, int]] = {}
    sidecars = sorted(n for n, _ in loc.list_dir(path) if n.startswith("__") and n.endswith(f"_{_SIDECAR_SUFFIX}"))
    for name in sidecars:
        merged.update(json.loads(loc.read_text(loc.join(path, name))))
        loc.remove(loc.join(path, name))
    metadata = loc.join(path, METADATA_FILE)
    merged[METADATA_FILE] = {"size": loc.size(metadata), "crc32": loc.crc32(metadata)}
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
        file = loc.join(path, name)
        if not loc.is_file(file):
            problems.append(f"{file} is missing")
            continue
        size = loc.size(file)
        want = recorded.get(name) if recorded else None
        if want is None:
            if name in needed and size < needed[name]:
                problems.append(
                    f"{file} is truncated: {size} bytes, but {METADATA_FILE} places data up to byte {needed[name]}"
                )
            continue
        if size != want["size"]:
            problems.append(f"{file} is {size} bytes but {want['size']} were written; the file is truncated or altered")
        elif check_crc and loc.crc32(file) != want["crc32"]:
            problems.append(f"{file} fails its CRC-32 check: its bytes differ from those written (corrupt file)")
    return problems


def data_files(path: str | os.PathLike, metadata: Metadata, recorded: dict | None) -> list[str]:
    """Every file name verify_files would look at, in a fixed order (to split among ranks)."""
    return sorted(set(_sizes_from_metadata(metadata)) | set(recorded or ()))
