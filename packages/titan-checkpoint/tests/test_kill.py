"""A process killed (SIGKILL) in the middle of a save leaves the previous checkpoint as the one that loads."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import ckpt_toy
import torch

from titan_checkpoint import CheckpointConfig, complete_steps

SCRIPT = Path(__file__).with_name("kill_during_save.py")


def test_kill_9_during_save_then_the_previous_checkpoint_loads(tmp_path):
    folder = tmp_path / "ckpt"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(folder)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()  # blocks until the save of step 2 is half written
        assert line.strip() == "WRITING", f"script ended early: {line!r} (exit code {proc.poll()})"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    partial = folder / ".step-2.tmp"
    assert any(partial.glob("*.distcp")) and not (partial / "titan_meta.json").exists()
    assert complete_steps(folder) == [1]

    resumed = ckpt_toy.toy_run(folder, seed=1, config=CheckpointConfig(interval=1))
    assert resumed.manager.load() == 1
    reference = ckpt_toy.toy_run(tmp_path / "reference")  # the same run, one step, never interrupted
    reference.step()
    for name, value in ckpt_toy.params(resumed.model).items():
        assert torch.equal(value, ckpt_toy.params(reference.model)[name]), name

    # Saving step 2 again replaces the debris of the killed save.
    resumed.step()
    resumed.manager.save(2)
    assert complete_steps(folder) == [1, 2] and not partial.exists()
