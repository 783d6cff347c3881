"""The one interface the checkpoint code talks to, whatever holds the files: a local folder (local_folder.py)
or a prefix in an object store (object_store.py).

Each kind brings its own commit protocol, the rule that keeps a crash from leaving a half-written checkpoint
where a complete one is expected: a save writes into `staging()`, then its marker file last, then
`publish()` makes it the checkpoint. A local folder stages in a temporary folder and renames it into place;
an object store has no atomic rename, so it writes in place and the marker itself is the commit.
"""

from __future__ import annotations

import json
import zlib
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from pathlib import Path
from typing import IO, Any

_CHUNK = 16 << 20


class Location(ABC):
    """A file or folder where checkpoints are read and written. `str()` gives the path or URL."""

    @property
    @abstractmethod
    def plain(self) -> Path | str:
        """What callers of the public API see: a Path (local disk) or the URL string."""

    # ---- names --------------------------------------------------------------------------------------

    @abstractmethod
    def join(self, *names: str) -> Location: ...

    @property
    @abstractmethod
    def name(self) -> str: ...

    @property
    @abstractmethod
    def parent(self) -> Location: ...

    @property
    def local_path(self) -> Path | None:
        """The path on this machine's disk, None where the files are elsewhere."""
        return None

    def __str__(self) -> str:
        return str(self.plain)

    # ---- files --------------------------------------------------------------------------------------

    @abstractmethod
    def is_file(self) -> bool: ...

    @abstractmethod
    def is_dir(self) -> bool: ...

    @abstractmethod
    def list_dir(self) -> list[tuple[str, bool]]:
        """(name, is_folder) of each entry of this folder; [] if there is none."""

    @abstractmethod
    def size(self) -> int: ...

    @abstractmethod
    def open_file(self, mode: str = "rb") -> IO[Any]: ...

    @abstractmethod
    def write_text_durably(self, text: str) -> None:
        """Write `text` so that readers see the old file or the new one, never a part of it."""

    @abstractmethod
    def remove(self) -> None:
        """Remove this file, or this folder with everything in it; nothing if absent."""

    @abstractmethod
    def make_dirs(self) -> None: ...

    def read_text(self) -> str:
        with self.open_file("rb") as f:
            return f.read().decode()

    def write_json(self, data: Any) -> None:
        self.write_text_durably(json.dumps(data, indent=1, sort_keys=True))

    def crc32(self) -> int:
        crc = 0
        with self.open_file("rb") as f:
            while chunk := f.read(_CHUNK):
                crc = zlib.crc32(chunk, crc)
        return crc

    # ---- the commit protocol of a checkpoint folder -------------------------------------------------

    @abstractmethod
    def staging(self) -> Location:
        """Where a save of this checkpoint folder writes until it is published."""

    @abstractmethod
    def begin(self, marker: str) -> None:
        """Make `staging()` an empty folder, removing what an interrupted save left there; never leaves this
        folder reading as complete with part of the new files in it."""

    @abstractmethod
    def publish(self) -> None:
        """Make the finished save in `staging()`, its `marker` written last, this checkpoint folder
        (replacing an older one)."""

    @abstractmethod
    def discard(self, marker: str) -> None:
        """Delete this complete checkpoint folder so that a crash midway leaves a leftover that is ignored,
        never a folder that reads as complete."""

    @abstractmethod
    def committed(self, marker: str) -> bool:
        """Whether this checkpoint folder is complete (holds its marker). False for a save that did not
        finish, where a save can leave one; CheckpointCorruptError where no save leaves one."""

    # ---- DCP and local copies -----------------------------------------------------------------------

    @abstractmethod
    def dcp_reader(self) -> Any:
        """A torch.distributed.checkpoint reader of this checkpoint folder (dcp_files.py's safe one)."""

    @abstractmethod
    def dcp_writer(self) -> Any:
        """A torch.distributed.checkpoint writer into this folder (dcp_files.py's checksumming one)."""

    @abstractmethod
    def local_copy(self) -> AbstractContextManager[Path]:
        """This folder on local disk for the duration of the `with` (downloaded if need be)."""

    @abstractmethod
    def written_locally(self) -> AbstractContextManager[Path]:
        """A local path to write this folder's contents to; on leaving the `with` they are here."""

    @abstractmethod
    def check_writable(self, key: str) -> None:
        """Raise ValueError naming `key` if writing here will fail for reasons a probe finds now."""

    @property
    @abstractmethod
    def probed_before_use(self) -> bool:
        """Whether `check_writable` can find anything: an unreachable store, not a folder made on demand."""

    def record_name(self) -> str:
        """How a record (titan_meta.json) names this location: an absolute path, or the URL."""
        return str(self)
