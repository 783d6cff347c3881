"""[fault_tolerance]: what is refused before any process starts, how a group's batch share is computed, and the
plain run's hooks. The replica groups themselves run in integration/test_replica_groups.py."""

import pytest

from titan_train.config import ConfigError, load_config, parse_argv
from titan_train.config.parallel_layout import resolve_layout
from titan_train.run.fault_tolerance import ReplicaGroups, SingleGroup


def cli(*argv: str):
    return load_config(parse_argv(list(argv)))


ON = ["--fault_tolerance.enable", "true", "--fault_tolerance.group_size", "2"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--fault_tolerance.enable", "true"], r"fault_tolerance.group_size=0: .* give the number of replica groups"),
        ([*ON, "--fault_tolerance.replica_id", "2"], r"fault_tolerance.replica_id=2 must be in \[0, .*group_size=2\)"),
        ([*ON, "--fault_tolerance.min_replica_size", "3"], r"min_replica_size=3 exceeds .*group_size=2.* use 1 .. 2"),
        ([*ON, "--parallelism.data_parallel_replicate_degree", "2"], r"data_parallel_replicate_degree=2 with .*set it"),
        (["--fault_tolerance.sync_steps", "0"], r"fault_tolerance.sync_steps=0 must be >= 1"),  # checked while off
        (["--fault_tolerance.semi_sync_method", "diloko"], r"fault_tolerance.semi_sync_method='diloko'"),
        (
            [*ON, "--fault_tolerance.semi_sync_method", "diloco", "--parallelism.pipeline_parallel_degree", "2"],
            r"semi_sync_method='diloco' with parallelism.pipeline_parallel_degree=2: .* use semi_sync_method='none'",
        ),
    ],
)
def test_bad_values_name_the_key_before_any_process_starts(argv, message, monkeypatch):
    monkeypatch.setenv("TORCHFT_LIGHTHOUSE", "http://localhost:29510")
    with pytest.raises(ConfigError, match=message):
        cli(*argv)


def test_the_lighthouse_address_is_required(monkeypatch):
    monkeypatch.delenv("TORCHFT_LIGHTHOUSE", raising=False)
    with pytest.raises(ConfigError, match="lighthouse_address is empty and TORCHFT_LIGHTHOUSE is not set"):
        cli(*ON)
    assert cli(*ON, "--fault_tolerance.lighthouse_address", "http://h:1").fault_tolerance.enable


def test_the_global_batch_is_the_whole_jobs(monkeypatch):
    """2 groups of 2 data-parallel ranks x 2 sequences: a global batch of 16 is 2 accumulation steps in each
    group, as in one run of 4 ranks; one that the groups cannot split evenly is refused, naming group_size."""
    monkeypatch.setenv("TORCHFT_LIGHTHOUSE", "http://localhost:29510")
    batch = ["--training.local_batch_size", "2", "--training.global_batch_size"]
    assert resolve_layout(cli(*ON, *batch, "16"), world_size=2).accumulation_steps == 2
    assert resolve_layout(cli(*batch, "16"), world_size=4).accumulation_steps == 2
    with pytest.raises(ConfigError, match=r"fault_tolerance.group_size=2 = 8; use a multiple of 8"):
        resolve_layout(cli(*ON, *batch, "12"), world_size=2)


def test_group_g_reads_the_rows_of_data_parallel_ranks_after_those_of_groups_before_it():
    groups = object.__new__(ReplicaGroups)  # data_share reads only the config
    groups.cfg = cli(
        *ON, "--fault_tolerance.replica_id", "1", "--fault_tolerance.lighthouse_address", "x"
    ).fault_tolerance
    assert [groups.data_share(r, 2) for r in range(2)] == [(2, 4), (3, 4)]
    assert SingleGroup().data_share(1, 2) == (1, 2)


def test_one_group_commits_every_step_and_writes_checkpoints():
    single = SingleGroup()
    single.start_step()
    assert single.average(1.5) == 1.5 and single.should_commit() and single.writes_checkpoints()
    assert single.live() is None  # no "replicas" on the step line


def test_a_healed_rank_reads_its_own_rows_from_the_state_of_a_peer_groups_rank():
    """Healing hands rank r of a live group's dataloader state to rank r of the restarted group, whose rows of
    the global batch differ: the state is the stream position (the same on every rank), not the rows."""
    import torch

    from titan_train.data import build_dataloader
    from titan_train.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(None)

    def loader(dp_rank: int):
        return build_dataloader(dataset="kjv", dataset_path=None, tokenizer=tokenizer, seq_len=32,
                                local_batch_size=2, dp_rank=dp_rank, dp_world_size=4, seed=42)  # fmt: skip

    live_peer, restarted_before_failure = loader(0), loader(2)  # group 0 / group 1, group rank 0, 2 ranks each
    peer_batches, own_batches = iter(live_peer), iter(restarted_before_failure)
    for _ in range(5):
        next(peer_batches), next(own_batches)
    healed = loader(2)
    healed.load_state_dict(live_peer.state_dict())
    expected = next(own_batches)
    got = next(iter(healed))
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert not torch.equal(got[0], next(peer_batches)[0])  # the peer's own next rows are others


class _QuorumTimingOut:
    """torchft's Manager as `_join_quorum` sees it: start_quorum times out `failures` times, then forms."""

    def __init__(self, failures: int):
        self.failures, self.calls, self._quorum_future = failures, 0, None

    def start_quorum(self):
        self.calls += 1
        assert self._quorum_future is None, "asked again while the failed quorum's future was kept (it re-raises)"
        if self.calls <= self.failures:
            self._quorum_future = "failed"
            raise TimeoutError("quorum timed out")


def _groups_with(manager, ranks_answer: bool):
    groups = object.__new__(ReplicaGroups)
    groups.cfg = cli(*ON, "--fault_tolerance.lighthouse_address", "x").fault_tolerance
    groups.manager = manager
    groups._all_ranks_answer = lambda: ranks_answer
    return groups


def test_a_quorum_timeout_with_every_rank_of_the_group_here_asks_again():
    """Another group's hung rank keeps the lighthouse from forming any quorum until that group exits: a group
    whose ranks all answer waits it out rather than failing with it."""
    manager = _QuorumTimingOut(failures=2)
    _groups_with(manager, ranks_answer=True)._join_quorum()
    assert manager.calls == 3


def test_a_quorum_timeout_with_a_silent_rank_in_the_group_fails_it_for_a_restart():
    manager = _QuorumTimingOut(failures=1)
    with pytest.raises(RuntimeError, match=r"did not answer a barrier .* for its launcher to restart it"):
        _groups_with(manager, ranks_answer=False)._join_quorum()
    assert manager.calls == 1


class _GroupsArrivingOneByOne:
    """A Manager whose quorums see one more group each time, resumed at step 4 (a checkpoint's)."""

    def __init__(self):
        self.calls = 0

    def start_quorum(self):
        self.calls += 1

    def num_participants(self):
        return min(self.calls, 2)

    def current_step(self):
        return 4


def test_a_job_resumed_from_a_checkpoint_waits_for_all_its_groups_at_its_first_quorum():
    """Not only a fresh job: two groups restarted from step 4 start together, whichever came up first (else
    the first trains alone from step 5 and the other heals from it, as one CI run under load saw)."""
    manager = _GroupsArrivingOneByOne()
    groups = _groups_with(manager, ranks_answer=True)
    groups._per_step, groups._started, groups._last_live = True, False, 2
    groups.start_step()
    assert manager.calls == 2 and groups._started
    groups.start_step()  # later steps ask once: a group lost mid-run is not waited for
    assert manager.calls == 3
