"""A location on local disk. Its commit protocol: a save writes into the hidden folder `.<name>.tmp` beside
its checkpoint folder, then renames it into place; the rename is atomic, so the checkpoint folder exists
only once it is complete."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from titan_checkpoint.dcp_files import ChecksumWriter, SafeFileSystemReader
from titan_checkpoint.errors import CheckpointCorruptError
from titan_checkpoint.locations.base import Location

logger = logging.getLogger("titan.checkpoint")


@dataclass(frozen=True)
class LocalFolder(Location):
    path: Path

    @property
    def plain(self) -> Path:
        return self.path

    @property
    def local_path(self) -> Path:
        return self.path

    def join(self, *names: str) -> LocalFolder:
        return LocalFolder(self.path.joinpath(*names))

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def parent(self) -> LocalFolder:
        return LocalFolder(self.path.parent)

    def is_file(self) -> bool:
        return self.path.is_file()

    def is_dir(self) -> bool:
        return self.path.is_dir()

    def list_dir(self) -> list[tuple[str, bool]]:
        return [(entry.name, entry.is_dir()) for entry in self.path.iterdir()] if self.path.is_dir() else []

    def size(self) -> int:
        return self.path.stat().st_size

    def open_file(self, mode: str = "rb") -> IO[Any]:
        return self.path.open(mode)

    def write_text_durably(self, text: str) -> None:
        """To a temporary name, fsync, then rename (atomic on POSIX)."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def remove(self) -> None:
        if self.path.is_dir():
            shutil.rmtree(self.path, ignore_errors=True)
        else:
            self.path.unlink(missing_ok=True)

    def make_dirs(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)

    # ---- commit protocol: stage in `.<name>.tmp`, then rename --------------------------------------

    def staging(self) -> LocalFolder:
        return LocalFolder(self.path.with_name(f".{self.path.name}.tmp"))

    def begin(self, marker: str) -> None:
        staging = self.staging()
        staging.remove()
        staging.make_dirs()

    def publish(self) -> None:
        old = None
        if self.path.exists():
            old = self.path.with_name(f".{self.path.name}.old")
            LocalFolder(old).remove()
            os.rename(self.path, old)
        os.rename(self.staging().path, self.path)
        _fsync_dir(self.path.parent)
        if old is not None:
            LocalFolder(old).remove()

    def discard(self, marker: str) -> None:
        doomed = self.staging()  # what a crash midway leaves reads as an interrupted save
        doomed.remove()
        os.rename(self.path, doomed.path)
        doomed.remove()

    def committed(self, marker: str) -> bool:
        if not self.join(marker).is_file():
            raise CheckpointCorruptError(
                f"{self.join(marker)} is missing: {self} was not written by a complete save "
                f"(a save renames .step-N.tmp to step-N only after writing {marker}); remove or repair it"
            )
        return True

    # ---- DCP and local copies -----------------------------------------------------------------------

    def dcp_reader(self) -> SafeFileSystemReader:
        return SafeFileSystemReader(self)

    def dcp_writer(self) -> ChecksumWriter:
        return ChecksumWriter(self)

    @contextmanager
    def local_copy(self) -> Iterator[Path]:
        yield self.path

    @contextmanager
    def written_locally(self) -> Iterator[Path]:
        yield self.path

    def check_writable(self, key: str) -> None:
        pass  # made at the first save, like any other local output

    @property
    def probed_before_use(self) -> bool:
        return False

    def record_name(self) -> str:
        return str(self.path.resolve())


def _fsync_dir(path: os.PathLike) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
