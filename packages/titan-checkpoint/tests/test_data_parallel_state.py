"""DataParallelState through the CheckpointManager on one process: the same dp size reads only its own
entry, another dp size hands every saved rank's state to load_state_dict_resharded. Several dp ranks'
entries are written from one process by saving their DataParallelStates under one name, which is what a
multi-rank save leaves in the checkpoint (the real 2-rank save is in test_two_ranks.py)."""

import pytest
from ckpt_toy import ToyShard

from titan_checkpoint import CheckpointConfig, CheckpointManager, CheckpointMismatchError, DataParallelState, RankLocal

CONFIG = CheckpointConfig(interval=1, save_rng=False)


class SeveralRanks:
    """The entries of dp ranks 0..n-1, saved from one process."""

    def __init__(self, values: list[int]):
        self.ranks = [DataParallelState(ToyShard(v), i, len(values)) for i, v in enumerate(values)]

    def state_dict(self) -> dict:
        return {k: v for rank in self.ranks for k, v in rank.state_dict().items()}


def save(folder, values: list[int]) -> None:
    manager = CheckpointManager(folder, {"data": SeveralRanks(values)}, CONFIG)
    manager.save(1)
    manager.close()


def load(folder, dp_rank: int, dp_world_size: int, inner=None, **config) -> ToyShard:
    inner = inner or ToyShard()
    state = DataParallelState(inner, dp_rank, dp_world_size)
    config = CheckpointConfig(save_rng=False, **config)
    assert CheckpointManager(folder, {"data": state}, config).load() == 1
    return inner


def test_same_dp_size_loads_each_rank_its_own_entry(tmp_path):
    save(tmp_path, [10, 11])
    for rank in range(2):
        shard = load(tmp_path, rank, 2)
        assert shard.restored == ("own", {"value": 10 + rank}) and shard.value == 10 + rank
    assert DataParallelState(ToyShard(), 1, 2).entries_to_load(["rank1", "rank0"]) == ["rank1"]


@pytest.mark.parametrize(("saved", "world"), [(2, 1), (2, 3), (4, 2), (1, 2)])
def test_another_dp_size_gets_every_saved_state(tmp_path, saved, world):
    save(tmp_path, [10 + i for i in range(saved)])
    states = [{"value": 10 + i} for i in range(saved)]
    for rank in range(world):
        assert load(tmp_path, rank, world).restored == ("resharded", states, rank, world)


def test_rank_local_checkpoints_load_as_data_parallel_state(tmp_path):
    manager = CheckpointManager(tmp_path, {"data": RankLocal(ToyShard(7), 0)}, CONFIG)
    manager.save(1)
    manager.close()
    assert load(tmp_path, 0, 1).restored == ("own", {"value": 7})


class NoReshard:
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        raise AssertionError("must not be called")


def test_state_that_cannot_reshard_is_refused_before_reading(tmp_path):
    save(tmp_path, [10, 11])
    with pytest.raises(
        CheckpointMismatchError,
        match=r"data was saved by 2 data-parallel ranks and is loaded by 4, but NoReshard has no "
        r"load_state_dict_resharded.*exclude_from_loading",
    ):
        load(tmp_path, 0, 4, inner=NoReshard())
    load(tmp_path, 0, 4, inner=NoReshard(), exclude_from_loading=["data"])


def test_entries_must_be_one_per_rank():
    state = DataParallelState(ToyShard(), 0, 2)
    with pytest.raises(ValueError, match=r"holds entries \['rank0', 'rank2'\], expected rank0 \.\. rank<n-1>"):
        state.entries_to_load(["rank0", "rank2"])
    with pytest.raises(ValueError, match=r"dp_rank=2 must be in \[0, dp_world_size=2\)"):
        DataParallelState(ToyShard(), 2, 2)
