"""torch.distributed.checkpoint readers and writers with what plain DCP does not promise: nothing loaded
executes pickled code, and every file written has its size and CRC-32 recorded while it is written (no second
read). A location (locations/) picks the reader and writer of its kind; storage.py builds the checks on them.
"""

from __future__ import annotations

import io
import os
import pickle
import threading
import warnings
import zlib
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed.checkpoint.metadata as dcp_metadata
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter, Metadata

try:  # torch 2.15 makes the module public (deprecating the private one); its FileSystem stays private
    from torch.distributed.checkpoint.fsspec_filesystem import FsspecReader, FsspecWriter
    from torch.distributed.checkpoint.fsspec_filesystem import _FileSystem as FsspecFileSystem
except ImportError:  # torch 2.13, 2.14
    from torch.distributed.checkpoint._fsspec_filesystem import FileSystem as FsspecFileSystem
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from titan_checkpoint.errors import CheckpointCorruptError
from titan_checkpoint.locations.base import Location

METADATA_FILE = ".metadata"
SIDECAR_SUFFIX = "checksums.json"

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


def read_metadata_file(folder: Location) -> Metadata:
    """The DCP metadata of the checkpoint folder `folder`, read without running pickled code."""
    file = folder.join(METADATA_FILE)
    if not file.is_file():
        raise CheckpointCorruptError(f"{file} is missing: {folder} is not a complete DCP checkpoint")
    try:
        with file.open_file("rb") as f:
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

    def __init__(self, location: Location):
        super().__init__(str(location))
        self.location = location
        self._metadata: Metadata | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self._metadata is None:
            self._metadata = read_metadata_file(self.location)
        if self._metadata.storage_meta is not None:
            self._metadata.storage_meta.load_id = self.load_id
        return self._metadata

    def read_data(self, plan, planner):
        try:
            return super().read_data(plan, planner)
        except Exception as e:
            files = sorted(
                {str(self.location.join(self.storage_data[item.storage_index].relative_path)) for item in plan.items}
            )
            raise CheckpointCorruptError(
                f"reading {', '.join(files)} failed ({type(e).__name__}: {e}); the checkpoint is corrupt or truncated"
            ) from e


class SafeFileSystemReader(_SafeReading, FileSystemReader):
    """A local checkpoint's reader."""


class SafeFsspecReader(_SafeReading, FsspecReader):
    """An object-store checkpoint's reader (fsspec)."""


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
        self.location.join(f"{prefix}{SIDECAR_SUFFIX}").write_json(mine)
        return future


class ChecksumWriter(_ChecksumWriting, FileSystemWriter):
    """A local checkpoint's writer."""

    def __init__(self, location: Location, **kwargs: Any):
        super().__init__(str(location), **kwargs)
        self.location = location
        self.fs = _ChecksummingFileSystem()


class FsspecChecksumWriter(_ChecksumWriting, FsspecWriter):
    """An object-store checkpoint's writer (fsspec). No fsync: an object exists once its upload completes."""

    def __init__(self, location: Location, **kwargs: Any):
        super().__init__(str(location), sync_files=False, **kwargs)
        self.location = location
        filesystem = _ChecksummingFsspecFileSystem()
        self.path = filesystem.init_path(str(location))
        self.fs = filesystem
