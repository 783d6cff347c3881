"""Saves step 1, then starts an asynchronous save of step 2 that stalls, printing where; test_kill.py and
test_object_store.py kill -9 it there.

    python kill_during_save.py FOLDER [data|commit]

data (default): halfway through writing a data file (WRITING). commit: once every file of step 2 is
written, just before its titan_meta.json, the commit (COMMITTING).
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ckpt_toy  # noqa: E402

from titan_checkpoint import CheckpointConfig, folder  # noqa: E402
from titan_checkpoint.storage import _Crc32Stream  # noqa: E402

stage = sys.argv[2] if len(sys.argv) > 2 else "data"
run = ckpt_toy.toy_run(sys.argv[1], config=CheckpointConfig(interval=1, async_mode="async"))
run.step()
run.manager.save(1)
run.manager.wait()

write, write_meta = _Crc32Stream.write, folder.write_meta


def stalling_write(self, data):
    written = write(self, data)
    if self.size > 1000:  # part of a data file is on disk, the rest never will be
        self.flush()
        print("WRITING", flush=True)
        time.sleep(600)
    return written


def stalling_commit(checkpoint, meta):
    print("COMMITTING", flush=True)
    time.sleep(600)


if stage == "data":
    _Crc32Stream.write = stalling_write
else:
    folder.write_meta = stalling_commit
run.step()
run.manager.save(2)
time.sleep(600)
