"""A fresh key namespace in torchrun's store for every group of workers it starts.

torchrun's agent keeps one TCPStore for the whole job (TORCHELASTIC_USE_AGENT_STORE=True) and the workers
of a restart find the keys the dead group wrote there: `init_process_group` reads a dead rank's gloo address
("Gloo connectFullMesh failed ... Connection refused") or waits on stale counters. torch adds no per-restart
prefix, and TORCHELASTIC_RESTART_COUNT is no substitute: an agent joining an elastic job later counts from 0.

So the ranks of a group agree on a namespace no earlier group can have written, before creating the group:
each rank r publishes a random nonce under `titan/hello/<r>`; rank 0 picks a random round id and answers every
nonce it reads with it (`titan/ack/<nonce>`), until every rank has confirmed the round (`titan/<round>/joined/
<r>`). A stale hello gets a useless answer; a fresh nonce can only be answered by this group's rank 0.
"""

from __future__ import annotations

import logging
import secrets
import time
from datetime import timedelta

import torch.distributed as dist

logger = logging.getLogger("titan")

_POLL_SECONDS = 0.05
_LOG_EVERY_SECONDS = 10.0


def _has(store: dist.Store, key: str) -> bool:
    return store.check([key])


def agree_on_round(store: dist.Store, rank: int, world_size: int, timeout_seconds: float) -> str:
    """The round id every rank of this group gets (called by all of them); RuntimeError naming the missing
    ranks after `timeout_seconds`."""
    deadline = time.monotonic() + timeout_seconds
    next_log = time.monotonic() + _LOG_EVERY_SECONDS
    nonce = secrets.token_hex(8)
    if rank == 0:
        round_id = secrets.token_hex(8)
        waiting = set(range(1, world_size))
        answered: dict[int, str] = {}
        while waiting:
            for peer in sorted(waiting):
                if _has(store, f"titan/{round_id}/joined/{peer}"):
                    waiting.discard(peer)
                elif _has(store, f"titan/hello/{peer}"):
                    peer_nonce = store.get(f"titan/hello/{peer}").decode()
                    if answered.get(peer) != peer_nonce:
                        store.set(f"titan/ack/{peer_nonce}", round_id)
                        answered[peer] = peer_nonce
            if waiting:
                next_log = _wait_or_fail(deadline, next_log, f"rank(s) {sorted(waiting)} to join")
        return round_id
    store.set(f"titan/hello/{rank}", nonce)
    ack = f"titan/ack/{nonce}"
    while not _has(store, ack):
        next_log = _wait_or_fail(deadline, next_log, "rank 0 to answer")
    round_id = store.get(ack).decode()
    store.set(f"titan/{round_id}/joined/{rank}", "1")
    return round_id


def _wait_or_fail(deadline: float, next_log: float, what: str) -> float:
    now = time.monotonic()
    if now > deadline:
        raise RuntimeError(
            f"process group setup: waited comm.init_timeout_seconds for {what}; a worker of this group did not "
            "start or cannot reach the store (MASTER_ADDR/MASTER_PORT)"
        )
    if now >= next_log:
        logger.info(f"process group setup: waiting for {what} ({deadline - now:.0f}s left)")
        next_log = now + _LOG_EVERY_SECONDS
    time.sleep(_POLL_SECONDS)
    return next_log


def torchrun_store(
    master_addr: str, master_port: int, rank: int, world_size: int, timeout_seconds: float
) -> dist.Store:
    """torchrun's shared store (TORCHELASTIC_USE_AGENT_STORE=True) under a namespace of this group's own."""
    store = dist.TCPStore(
        master_addr, master_port, world_size, is_master=False, timeout=timedelta(seconds=timeout_seconds)
    )
    round_id = agree_on_round(store, rank, world_size, timeout_seconds)
    logger.debug(f"process group setup: round {round_id} in the store at {master_addr}:{master_port}")
    return dist.PrefixStore(f"titan/{round_id}/", store)
