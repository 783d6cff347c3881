"""Stand-in checks for tests of tools/gpu_check.py's runner and results: each records a figure, then passes,
fails, crashes, dies or hangs, as a real check on a GPU might. The runner imports them in the check's own
process by their "gpu_check_fakes:NAME" target (the test puts integration/ on PYTHONPATH)."""

import os
import signal
import time

from gpu_checks.context import CheckFailed


def passes(ctx) -> None:
    ctx.record(tokens_per_s=1234.5, headline="1,234 tok/s")
    ctx.compare("case_a", "peak reserved", 1.1, 1.0, "GiB")


def fails(ctx) -> None:
    ctx.record(loss_first3=8.0, loss_last3=8.1)
    raise CheckFailed("the loss did not fall")


def crashes(ctx) -> None:
    ctx.record(before_the_crash=1)
    {}["no such key"]


def dies(ctx) -> None:
    ctx.record(before_dying=2)
    os.kill(os.getpid(), signal.SIGKILL)


def hangs(ctx) -> None:
    ctx.record(before_hanging=3)
    time.sleep(600)
