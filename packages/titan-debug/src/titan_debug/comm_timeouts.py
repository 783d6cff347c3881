"""Two collective timeouts: a long one while ranks initialize, a short one once training runs.

The first step is slow on some ranks (compilation, checkpoint load, dataloader start) and a short timeout
there kills healthy runs; later a hang should surface in minutes, not the default 10-30. So
``init_process_group(timeout=init_timeout)``, then after the first step ``set_collective_timeout``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

import torch.distributed as dist
from torch.distributed import ProcessGroup


def set_collective_timeout(timeout_seconds: float, groups: Iterable[ProcessGroup] = ()) -> None:
    """Set the timeout of the default process group and of ``groups`` (e.g. a device mesh's groups).

    Every rank must call it at the same point: it starts with a barrier so that no rank issues a collective
    under the short timeout while a peer is still finishing work under the long one.
    """
    if timeout_seconds <= 0:
        raise ValueError(f"comm.train_timeout_seconds={timeout_seconds} must be > 0")
    timeout = timedelta(seconds=timeout_seconds)
    dist.barrier()
    default = dist.distributed_c10d._get_default_group()
    for group in {default, *groups}:
        dist.distributed_c10d._set_pg_timeout(timeout, group)
