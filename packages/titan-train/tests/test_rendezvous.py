"""The ranks of a restarted group agree on a store namespace no earlier group wrote, even though torchrun's
shared store still holds the keys of the group that died."""

import threading
from datetime import timedelta

import pytest
import torch.distributed as dist

from titan_train.run.rendezvous import agree_on_round


def agree(store: dist.Store, world_size: int) -> list[str]:
    rounds: list[str | None] = [None] * world_size

    def join(rank: int) -> None:
        rounds[rank] = agree_on_round(store, rank, world_size, timeout_seconds=60)

    threads = [threading.Thread(target=join, args=(rank,)) for rank in reversed(range(world_size))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    return rounds


def test_a_restarted_group_never_joins_the_dead_groups_round():
    store = dist.HashStore()
    first = agree(store, 3)
    assert first[0] is not None and first == [first[0]] * 3
    # The next group finds every key of the first one (hellos, answers, joins) and must not reuse its round.
    second = agree(store, 3)
    assert second[0] is not None and second == [second[0]] * 3
    assert second[0] != first[0]


def test_a_missing_rank_is_named_after_the_timeout():
    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=5))
    with pytest.raises(RuntimeError, match=r"waited comm.init_timeout_seconds for rank\(s\) \[1\] to join"):
        agree_on_round(store, 0, 2, timeout_seconds=0.3)
