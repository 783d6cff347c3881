"""Saves step 1, then starts an asynchronous save of step 2 that stalls, printing where; test_kill.py and
test_object_store.py kill -9 it there.

    python kill_during_save.py FOLDER [data|commit|multipart]

data (default): halfway through writing a data file (WRITING). commit: once every file of step 2 is
written, just before its titan_meta.json, the commit (COMMITTING). multipart: an s3:// FOLDER only, a model of
MULTIPART_ARGS whose data file spans several 5 MiB parts of s3fs's multipart upload, stalled once parts are
uploaded and before the upload completes (WRITING).
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ckpt_toy  # noqa: E402

from titan_checkpoint import CheckpointConfig, folder  # noqa: E402
from titan_checkpoint.storage import _Crc32Stream  # noqa: E402

# About 25 MiB of weights and AdamW moments in one data file.
MULTIPART_ARGS = ckpt_toy.ToyArgs(dim=512)
PART_BYTES = 5 * 2**20  # S3's smallest part; s3fs's default is 50 MiB, so a smaller checkpoint spans parts

stage = sys.argv[2] if len(sys.argv) > 2 else "data"
stall_after = 1000
if stage == "multipart":
    import s3fs

    s3fs.S3FileSystem.default_block_size = PART_BYTES
    stall_after = 3 * PART_BYTES  # two parts or more uploaded, the upload not completed
args = MULTIPART_ARGS if stage == "multipart" else None
run = ckpt_toy.toy_run(sys.argv[1], config=CheckpointConfig(interval=1, async_mode="async"), args=args)
run.step()
run.manager.save(1)
run.manager.wait()

write, write_meta = _Crc32Stream.write, folder.write_meta


def stalling_write(self, data):
    written = write(self, data)
    if self.size > stall_after:  # part of a data file is written, the rest never will be
        self.flush()
        print("WRITING", flush=True)
        time.sleep(600)
    return written


def stalling_commit(checkpoint, meta):
    print("COMMITTING", flush=True)
    time.sleep(600)


if stage in ("data", "multipart"):
    _Crc32Stream.write = stalling_write
else:
    folder.write_meta = stalling_commit
run.step()
run.manager.save(2)
time.sleep(600)
