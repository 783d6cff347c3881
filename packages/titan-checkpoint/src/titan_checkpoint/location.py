"""Where checkpoints live: a local folder, or a prefix in an object store named by an fsspec URL.

A location is a `Path` (local disk; `file://` URLs become one) or a URL string (`s3://bucket/prefix`,
`memory://prefix`). This module is the one place that tells them apart: the file operations below act on
either, and `atomic_rename(location)` tells folder.py which crash-safety protocol applies (an object store
has no atomic rename, so its checkpoints are complete by their commit marker instead).

Credentials and endpoints are fsspec's and s3fs's business (environment variables such as
AWS_ACCESS_KEY_ID / AWS_ENDPOINT_URL, or ~/.aws/config); nothing here reads, stores or logs them.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
import zlib
from pathlib import Path
from typing import IO, Any

# Schemes tested end to end (s3 against a real S3 server, memory in-process); others are refused until they are.
URL_SCHEMES = ("s3", "memory", "file")
_EXTRAS = {"s3": ("s3fs", "pip install 'titan-checkpoint[s3]'")}
_CHUNK = 16 << 20

Location = Path | str


def scheme(value: str | os.PathLike) -> str | None:
    """The URL scheme of `value` ('s3' for 's3://b/p'), None for a plain path."""
    text = os.fspath(value)
    head, sep, _ = text.partition("://")
    return head.lower() if sep and head.isidentifier() else None


def check_location(value: str | os.PathLike | None, key: str) -> None:
    """Raise ValueError naming `key` when `value` is a URL Titan cannot write to (unknown scheme, or its
    fsspec implementation not installed); plain paths always pass."""
    if value is None or scheme(value) is None:
        return
    name = scheme(value)
    if name not in URL_SCHEMES:
        raise ValueError(
            f"{key}={os.fspath(value)!r}: the {name}:// scheme is not supported (supported: "
            f"{', '.join(s + '://' for s in URL_SCHEMES)}, or a local path); without this check the files would "
            "land in a local folder named after the URL"
        )
    module, install = _EXTRAS.get(name, (None, ""))
    if module is not None:
        try:
            __import__(module)
        except ImportError as e:
            raise ValueError(f"{key}={os.fspath(value)!r} needs the {module} package: {install}") from e


def as_location(value: str | os.PathLike) -> Location:
    """A Path for a local folder (`file://` included), the URL (without a trailing '/') otherwise."""
    name = scheme(value)
    if name is None:
        return Path(value)
    if name == "file":
        return Path(os.fspath(value)[len("file://") :])
    check_location(value, "checkpoint location")
    return os.fspath(value).rstrip("/")


def atomic_rename(location: Location) -> bool:
    """Whether a folder can be renamed into place atomically here (local disk: yes; object stores: no)."""
    return isinstance(location, Path)


def join(location: Location, *names: str) -> Location:
    if isinstance(location, Path):
        return location.joinpath(*names)
    return "/".join([location, *names])


def name_of(location: Location) -> str:
    return location.name if isinstance(location, Path) else location.rsplit("/", 1)[-1]


def parent_of(location: Location) -> Location:
    return location.parent if isinstance(location, Path) else location.rsplit("/", 1)[0]


def _fs(url: str):
    from fsspec.core import url_to_fs

    fs, path = url_to_fs(url)
    # fsspec caches listings per instance, and other ranks and processes write here too.
    fs.invalidate_cache()
    return fs, path


def is_file(location: Location) -> bool:
    if isinstance(location, Path):
        return location.is_file()
    fs, path = _fs(location)
    return fs.isfile(path)


def is_dir(location: Location) -> bool:
    if isinstance(location, Path):
        return location.is_dir()
    fs, path = _fs(location)
    return fs.isdir(path)


def list_dir(location: Location) -> list[tuple[str, bool]]:
    """(name, is_folder) of each entry of the folder `location`; [] if there is none."""
    if isinstance(location, Path):
        return [(entry.name, entry.is_dir()) for entry in location.iterdir()] if location.is_dir() else []
    fs, path = _fs(location)
    try:
        entries = fs.ls(path, detail=True, refresh=True) if fs.isdir(path) else []
    except FileNotFoundError:
        return []
    return [(entry["name"].rstrip("/").rsplit("/", 1)[-1], entry["type"] == "directory") for entry in entries]


def size(location: Location) -> int:
    if isinstance(location, Path):
        return location.stat().st_size
    fs, path = _fs(location)
    return fs.size(path)


def open_file(location: Location, mode: str = "rb") -> IO[Any]:
    if isinstance(location, Path):
        return location.open(mode)
    fs, path = _fs(location)
    return fs.open(path, mode)


def read_text(location: Location) -> str:
    with open_file(location, "rb") as f:
        return f.read().decode()


def write_json(location: Location, data: Any) -> None:
    """Write JSON durably: locally to a temporary name, fsync, then rename (atomic on POSIX); to an object
    store as one object (a PUT is atomic: readers see the old object or the new one, never a part)."""
    text = json.dumps(data, indent=1, sort_keys=True)
    if not isinstance(location, Path):
        with open_file(location, "wb") as f:
            f.write(text.encode())
        return
    tmp = location.with_name(location.name + ".tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, location)


def remove(location: Location) -> None:
    """Remove a file or a folder with everything in it; nothing if absent."""
    if isinstance(location, Path):
        if location.is_dir():
            shutil.rmtree(location, ignore_errors=True)
        else:
            location.unlink(missing_ok=True)
        return
    fs, path = _fs(location)
    try:
        fs.rm(path, recursive=True)
    except FileNotFoundError:
        pass


def make_dirs(location: Location) -> None:
    if isinstance(location, Path):
        location.mkdir(parents=True, exist_ok=True)
    else:
        fs, path = _fs(location)
        fs.makedirs(path, exist_ok=True)


def crc32(location: Location) -> int:
    crc = 0
    with open_file(location, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def upload_folder(local: Path, location: str) -> None:
    """Copy the local folder `local` to the object-store prefix `location`, then delete what was there before
    and is not part of the new copy (so readers see old or new files, never a folder with neither)."""
    fs, path = _fs(location)
    before = {p.rstrip("/") for p in fs.find(path)} if fs.exists(path) else set()
    written = set()
    for file in sorted(p for p in local.rglob("*") if p.is_file()):
        target = f"{path}/{file.relative_to(local).as_posix()}"
        fs.put_file(str(file), target)
        written.add(target)
    for stale in sorted(before - written):
        fs.rm(stale)


def download_folder(location: str, local: Path) -> Path:
    """Copy every file under the object-store prefix `location` into the local folder `local`."""
    fs, path = _fs(location)
    files = fs.find(path)
    if not files:
        raise FileNotFoundError(f"{location} holds no files")
    for remote in files:
        target = local / remote[len(path) :].lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(remote, str(target))
    return local


def probe_writable(location: Location, key: str) -> None:
    """Write and delete a small object under `location`, so an unreachable endpoint, a missing bucket or
    denied access is an error before training starts, naming the URL and what failed."""
    if isinstance(location, Path):
        return
    probe = join(location, f".titan-write-probe-{uuid.uuid4().hex}")
    try:
        with open_file(probe, "wb") as f:
            f.write(b"titan")
        remove(probe)
    except Exception as e:  # fsspec backends raise their own types (botocore, aiohttp, PermissionError, ...)
        raise ValueError(
            f"{key}={location!r}: cannot write there ({type(e).__name__}: {e}); check the bucket exists, the "
            "endpoint is reachable (AWS_ENDPOINT_URL for a non-AWS server) and the credentials allow writing"
        ) from e
