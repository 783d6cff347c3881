"""A real S3 API on the loopback address for the object-storage tests: moto's server, in its own process
(the same HTTP requests s3fs sends to AWS, answered by an independent implementation of the protocol)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager

from forked_ranks import free_port  # tools/, on the path (conftest.py)

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "titan-test",
    "AWS_SECRET_ACCESS_KEY": "titan-test",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@contextmanager
def s3_server():
    """Start the server; yield its endpoint URL with the environment set as a user would set it for a
    non-AWS S3 service (AWS_ENDPOINT_URL and credentials, read by s3fs/botocore, never by Titan)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in [*CREDENTIALS, "AWS_ENDPOINT_URL"]}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the S3 server did not start (exit code {proc.poll()})") from None
                time.sleep(0.1)
        os.environ.update(CREDENTIALS, AWS_ENDPOINT_URL=endpoint)
        yield endpoint
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        proc.terminate()
        proc.wait(timeout=30)


def make_bucket(name: str) -> None:
    import s3fs

    s3fs.S3FileSystem(skip_instance_cache=True).mkdir(name)
