"""Saves step 1, then starts an asynchronous save of step 2 that stalls halfway through writing a data file,
printing WRITING; test_kill.py kill -9s it there.

    python kill_during_save.py FOLDER
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ckpt_toy  # noqa: E402

from titan_checkpoint import CheckpointConfig  # noqa: E402
from titan_checkpoint.storage import _Crc32Stream  # noqa: E402

run = ckpt_toy.toy_run(sys.argv[1], config=CheckpointConfig(interval=1, async_mode="async"))
run.step()
run.manager.save(1)
run.manager.wait()

write = _Crc32Stream.write


def stalling_write(self, data):
    written = write(self, data)
    if self.size > 1000:  # part of a data file is on disk, the rest never will be
        self.flush()
        print("WRITING", flush=True)
        time.sleep(600)
    return written


_Crc32Stream.write = stalling_write
run.step()
run.manager.save(2)
time.sleep(600)
