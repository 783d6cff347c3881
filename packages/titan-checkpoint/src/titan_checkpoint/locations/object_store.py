"""A location in an object store, named by an fsspec URL (`s3://bucket/prefix`, `memory://prefix`). Its
commit protocol: there is no atomic rename, so a save writes straight into its checkpoint folder, and the
marker, written last as one object, is the commit; a folder without it is a save that did not finish and is
never loaded. Removing a checkpoint deletes its marker first."""

from __future__ import annotations

import logging
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from titan_checkpoint.dcp_files import FsspecChecksumWriter, SafeFsspecReader
from titan_checkpoint.locations.base import Location

logger = logging.getLogger("titan.checkpoint")


def _fs(url: str):
    from fsspec.core import url_to_fs

    fs, path = url_to_fs(url)
    # fsspec caches listings per instance, and other ranks and processes write here too.
    fs.invalidate_cache()
    return fs, path


@dataclass(frozen=True)
class ObjectStorePrefix(Location):
    url: str  # without a trailing '/'

    @property
    def plain(self) -> str:
        return self.url

    def join(self, *names: str) -> ObjectStorePrefix:
        return ObjectStorePrefix("/".join([self.url, *names]))

    @property
    def name(self) -> str:
        return self.url.rsplit("/", 1)[-1]

    @property
    def parent(self) -> ObjectStorePrefix:
        return ObjectStorePrefix(self.url.rsplit("/", 1)[0])

    def is_file(self) -> bool:
        fs, path = _fs(self.url)
        return fs.isfile(path)

    def is_dir(self) -> bool:
        fs, path = _fs(self.url)
        return fs.isdir(path)

    def list_dir(self) -> list[tuple[str, bool]]:
        fs, path = _fs(self.url)
        try:
            entries = fs.ls(path, detail=True, refresh=True) if fs.isdir(path) else []
        except FileNotFoundError:
            return []
        return [(entry["name"].rstrip("/").rsplit("/", 1)[-1], entry["type"] == "directory") for entry in entries]

    def size(self) -> int:
        fs, path = _fs(self.url)
        return fs.size(path)

    def open_file(self, mode: str = "rb") -> IO[Any]:
        fs, path = _fs(self.url)
        return fs.open(path, mode)

    def write_text_durably(self, text: str) -> None:
        """As one object: a PUT is atomic, readers see the old object or the new one, never a part."""
        with self.open_file("wb") as f:
            f.write(text.encode())

    def remove(self) -> None:
        fs, path = _fs(self.url)
        try:
            fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass

    def make_dirs(self) -> None:
        fs, path = _fs(self.url)
        fs.makedirs(path, exist_ok=True)

    # ---- commit protocol: write in place, the marker last -----------------------------------------

    def staging(self) -> ObjectStorePrefix:
        return self

    def begin(self, marker: str) -> None:
        # A complete checkpoint of the same step (a run resumed from an earlier step) is un-committed first.
        self.join(marker).remove()
        self.remove()
        self.make_dirs()

    def publish(self) -> None:
        pass  # the marker was the commit

    def discard(self, marker: str) -> None:
        self.join(marker).remove()
        self.remove()

    def committed(self, marker: str) -> bool:
        if self.join(marker).is_file():
            return True
        logger.debug(f"ignoring {self}: no {marker}, a save that did not finish")
        return False

    # ---- DCP and local copies -----------------------------------------------------------------------

    def dcp_reader(self) -> SafeFsspecReader:
        return SafeFsspecReader(self)

    def dcp_writer(self) -> FsspecChecksumWriter:
        return FsspecChecksumWriter(self)

    @contextmanager
    def local_copy(self) -> Iterator[Path]:
        """Downloaded to a temporary folder, removed afterwards."""
        with tempfile.TemporaryDirectory(prefix="titan-hf-") as staging:
            logger.info(f"checkpoint: downloading {self} to read it")
            yield self._download(Path(staging))

    @contextmanager
    def written_locally(self) -> Iterator[Path]:
        """Written to a temporary folder, then uploaded."""
        with tempfile.TemporaryDirectory(prefix="titan-export-") as staging:
            local = Path(staging) / "hf"
            yield local
            self._upload(local)
        logger.info(f"checkpoint: uploaded the export to {self}")

    def _upload(self, local: Path) -> None:
        """Copy the local folder `local` here, then delete what was here before and is not part of the new
        copy (so readers see old or new files, never a folder with neither)."""
        fs, path = _fs(self.url)
        before = {p.rstrip("/") for p in fs.find(path)} if fs.exists(path) else set()
        written = set()
        for file in sorted(p for p in local.rglob("*") if p.is_file()):
            target = f"{path}/{file.relative_to(local).as_posix()}"
            fs.put_file(str(file), target)
            written.add(target)
        for stale in sorted(before - written):
            fs.rm(stale)

    def _download(self, local: Path) -> Path:
        fs, path = _fs(self.url)
        files = fs.find(path)
        if not files:
            raise FileNotFoundError(f"{self} holds no files")
        for remote in files:
            target = local / remote[len(path) :].lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(remote, str(target))
        return local

    def check_writable(self, key: str) -> None:
        """Write and delete a small object here, so an unreachable endpoint, a missing bucket or denied access
        is an error before training starts, naming the URL and what failed."""
        probe = self.join(f".titan-write-probe-{uuid.uuid4().hex}")
        try:
            with probe.open_file("wb") as f:
                f.write(b"titan")
            probe.remove()
        except Exception as e:  # fsspec backends raise their own types (botocore, aiohttp, PermissionError, ...)
            raise ValueError(
                f"{key}={self.url!r}: cannot write there ({type(e).__name__}: {e}); check the bucket exists, the "
                "endpoint is reachable (AWS_ENDPOINT_URL for a non-AWS server) and the credentials allow writing"
            ) from e

    @property
    def probed_before_use(self) -> bool:
        return True
