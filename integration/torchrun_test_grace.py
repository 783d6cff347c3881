"""torchrun (`python -m torch.distributed.run`) with the grace it gives a worker between SIGTERM and SIGKILL, when
it stops a group to restart it, set for tests: GRACE_S instead of torchrun's fixed 30 s.

A worker stopped by SIGSTOP (a hung rank) never acts on SIGTERM, so each restart after one waited out all 30 s
(`LocalElasticAgent._shutdown`'s default, which --shutdown-timeout does not reach on a restart): a minute of the
two SIGSTOP cases' time, spent in torchrun, not in Titan. The path is unchanged (SIGTERM, the wait, SIGKILL, the
restart); only the wait is shorter. A live worker answers SIGTERM at once either way.

    python torchrun_test_grace.py [torchrun arguments...]
"""

import runpy
import signal

from torch.distributed.elastic.agent.server import local_elastic_agent

GRACE_S = 3
_shutdown = local_elastic_agent.LocalElasticAgent._shutdown


def _shutdown_with_test_grace(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
    _shutdown(self, death_sig, min(timeout, GRACE_S))


local_elastic_agent.LocalElasticAgent._shutdown = _shutdown_with_test_grace

if __name__ == "__main__":
    runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
