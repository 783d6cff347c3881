"""torchrun (`python -m torch.distributed.run`) with the grace it gives a worker between SIGTERM and SIGKILL, when
it stops a group, set for tests: GRACE_S instead of torchrun's fixed 30 s.

A worker stopped by SIGSTOP (a hung rank) never acts on SIGTERM, so each stop of its group after a failure waited
out all 30 s (`PContext.close`'s default: the process context closes the other workers when one fails, before the
agent restarts the group; --shutdown-timeout does not reach it): half a minute of each SIGSTOP case spent in
torchrun, not in Titan. The path is unchanged (SIGTERM, the wait, SIGKILL, the restart); only the wait is shorter.
A live worker answers SIGTERM at once either way.

    python torchrun_test_grace.py [torchrun arguments...]
"""

import runpy
import signal

from torch.distributed.elastic.multiprocessing import api

GRACE_S = 3
_close = api.PContext.close


def _close_with_test_grace(self, death_sig: signal.Signals | None = None, timeout: int = 30) -> None:
    _close(self, death_sig, min(timeout, GRACE_S))


api.PContext.close = _close_with_test_grace

if __name__ == "__main__":
    runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
