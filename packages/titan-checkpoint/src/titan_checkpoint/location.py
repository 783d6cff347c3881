"""Where checkpoints live: a local folder, or a prefix in an object store named by an fsspec URL.

`as_location` turns what a user gives (a path, a `file://` URL, `s3://bucket/prefix`, `memory://prefix`) into
a `Location` (locations/base.py); it is the one place that tells the two kinds apart. Everything else talks to
that interface, whose two classes each carry their own crash-safety protocol: `LocalFolder` (write into a
temporary folder, then rename) and `ObjectStorePrefix` (write in place, then the commit marker).

Credentials and endpoints are fsspec's and s3fs's business (environment variables such as
AWS_ACCESS_KEY_ID / AWS_ENDPOINT_URL, or ~/.aws/config); nothing here reads, stores or logs them.
"""

from __future__ import annotations

import os
from pathlib import Path

from titan_checkpoint.locations.base import Location
from titan_checkpoint.locations.local_folder import LocalFolder
from titan_checkpoint.locations.object_store import ObjectStorePrefix

# Schemes tested end to end (s3 against a real S3 server, memory in-process); others are refused until they are.
URL_SCHEMES = ("s3", "memory", "file")
_EXTRAS = {"s3": ("s3fs", "pip install 'titan-checkpoint[s3]'")}


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


def as_location(value: str | os.PathLike | Location) -> Location:
    """A LocalFolder for a local path (`file://` included), an ObjectStorePrefix for another URL (without a
    trailing '/'); a Location as it is."""
    if isinstance(value, Location):
        return value
    name = scheme(value)
    if name is None:
        return LocalFolder(Path(value))
    if name == "file":
        return LocalFolder(Path(os.fspath(value)[len("file://") :]))
    check_location(value, "checkpoint location")
    return ObjectStorePrefix(os.fspath(value).rstrip("/"))


__all__ = ["URL_SCHEMES", "LocalFolder", "Location", "ObjectStorePrefix", "as_location", "check_location", "scheme"]
