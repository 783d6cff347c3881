"""The layout-invariant data order (training.data_order = "global"): the global batch of step s is the same
sequences, in the same rows, whatever the data-parallel degree, gradient accumulation and number of
DataLoader workers; a resume on another layout continues at the next step's first sequence, replaying and
skipping nothing."""

import contextlib
import io
import json
import logging
from itertools import islice

import pytest
import torch

from titan_checkpoint import CheckpointConfig, CheckpointManager, DataParallelState
from titan_train.cli.data import main as titan_data
from titan_train.data import build_dataloader
from titan_train.data.sources import EmbeddedCorpus
from titan_train.data.tokenizer import load_tokenizer

GLOBAL_BATCH, SEQ_LEN = 8, 16
# 3 workers on a 2-core machine: torch suggests fewer, which this test of the round robin cannot take.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(None)


def loaders(tok, dp, accumulation, workers=0, global_batch=GLOBAL_BATCH, data_order="global"):
    local = global_batch // (dp * accumulation)
    return [
        build_dataloader(
            "kjv",
            "",
            tok,
            seq_len=SEQ_LEN,
            local_batch_size=local,
            dp_rank=rank,
            dp_world_size=dp,
            num_workers=workers,
            seed=3,
            accumulation_steps=accumulation,
            data_order=data_order,
        )  # fmt: skip
        for rank in range(dp)
    ]


def steps(iterators, accumulation, n):
    """The global batch of each of n steps: rank 0's micro-batches, then rank 1's, ... (rows of [G, seq])."""
    return [torch.cat([next(it)[0] for it in iterators for _ in range(accumulation)]) for _ in range(n)]


def stream(tok, n_steps, global_batch=GLOBAL_BATCH):
    """The packed stream itself: one reader, one batch per step."""
    return steps([iter(loaders(tok, 1, 1, global_batch=global_batch)[0])], 1, n_steps)


@pytest.mark.parametrize("source", ["jsonl", "pre-tokenized"])
def test_the_stream_is_the_single_reader_packing(tok, tmp_path, source):
    # The document-sharded order on one reader is the packer as it always was: the same windows, in order
    # (15 chapters, about 15k tokens: the 300 batches, 20k tokens, cross an epoch).
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in islice(EmbeddedCorpus().documents(), 15)))
    if source == "pre-tokenized":
        with contextlib.redirect_stdout(io.StringIO()):
            assert titan_data(["tokenize", str(path), str(tmp_path / "tokens")]) == 0
        path = tmp_path / "tokens"
    read = [
        torch.cat(
            [
                x
                for x, _ in islice(
                    build_dataloader(
                        "text", str(path), tok, seq_len=SEQ_LEN, local_batch_size=4, seed=3, data_order=order
                    ),
                    300,
                )
            ]
        )  # fmt: skip
        for order in ("global", "document_sharded")
    ]
    assert torch.equal(read[0], read[1])


@pytest.mark.parametrize(
    "dp, accumulation, workers", [(1, 4, 0), (2, 2, 0), (4, 1, 0), (2, 1, 2), (1, 2, 3)], ids=lambda v: str(v)
)
def test_global_batches_do_not_depend_on_the_layout(tok, dp, accumulation, workers):
    got = steps([iter(loader) for loader in loaders(tok, dp, accumulation, workers)], accumulation, 3)
    for step, (a, b) in enumerate(zip(got, stream(tok, 3), strict=True)):
        assert torch.equal(a, b), f"step {step}"


def test_document_sharded_order_depends_on_the_layout(tok):
    # What the global order fixes: per-rank document shards give dp 2 other sequences than one process.
    sharded = steps([iter(loader) for loader in loaders(tok, 2, 1, data_order="document_sharded")], 1, 1)
    assert not torch.equal(sharded[0], stream(tok, 1)[0])


def test_every_rank_saves_the_same_global_position(tok):
    ranks = loaders(tok, 4, 2)
    steps([iter(loader) for loader in ranks], 2, 3)
    states = [loader.state_dict()["dataset_state"] for loader in ranks]
    assert all(state == states[0] for state in states)
    assert states[0]["next_batch"] == 3 * 2  # after 3 steps of 2 micro-batches


def saved_after(tok, dp, accumulation, workers, n_steps, global_batch=GLOBAL_BATCH):
    ranks = loaders(tok, dp, accumulation, workers, global_batch)
    iterators = [iter(loader) for loader in ranks]
    head = steps(iterators, accumulation, n_steps)
    return head, [loader.state_dict() for loader in ranks]


@pytest.mark.parametrize(
    "old, new", [((4, 1, 0), (2, 1, 0)), ((2, 1, 2), (1, 2, 0)), ((1, 4, 0), (4, 1, 2))], ids=lambda v: str(v)
)
def test_resume_on_another_layout_continues_exactly(tok, old, new):
    head, states = saved_after(tok, *old, n_steps=2)
    dp, accumulation, workers = new
    resumed = loaders(tok, dp, accumulation, workers)
    for rank, loader in enumerate(resumed):
        loader.load_state_dict_resharded(states, rank, dp)
    tail = steps([iter(loader) for loader in resumed], accumulation, 3)
    for step, (a, b) in enumerate(zip(head + tail, stream(tok, 5), strict=True)):
        assert torch.equal(a, b), f"step {step}"


def test_same_dp_size_with_other_workers_and_accumulation_resumes_exactly(tok):
    head, states = saved_after(tok, 2, 1, 2, n_steps=2)
    resumed = loaders(tok, 2, 2, 0)  # same dp size: DataParallelState calls load_state_dict
    for loader, state in zip(resumed, states, strict=True):
        loader.load_state_dict(state)
    tail = steps([iter(loader) for loader in resumed], 2, 2)
    assert all(torch.equal(a, b) for a, b in zip(head + tail, stream(tok, 4), strict=True))


def test_another_global_batch_continues_the_stream_and_warns(tok, caplog):
    head, states = saved_after(tok, 4, 1, 0, n_steps=2)  # 2 steps of 8 sequences
    resumed = loaders(tok, 2, 1, global_batch=4)  # global_batch_size = -1 on fewer ranks: 4 sequences a step
    with caplog.at_level(logging.WARNING, logger="titan"):
        for rank, loader in enumerate(resumed):
            loader.load_state_dict_resharded(states, rank, 2)
    assert "global batch of 8 sequences, this run's is 4" in caplog.text
    assert "training.global_batch_size=8" in caplog.text
    tail = steps([iter(loader) for loader in resumed], 1, 3)
    sequences = torch.cat(head + tail)
    assert torch.equal(sequences, torch.cat(stream(tok, 7, global_batch=4)))  # 16 + 12 = 28 sequences


def test_a_state_in_the_middle_of_a_step_reshards_only_with_a_clear_error(tok):
    ranks = loaders(tok, 2, 2)
    for loader in ranks:
        next(iter(loader))  # one micro-batch of two
    states = [loader.state_dict() for loader in ranks]
    with pytest.raises(ValueError, match=r"middle of an optimizer step \(micro-batch 1 of 2\)"):
        loaders(tok, 1, 4)[0].load_state_dict_resharded(states, 0, 1)


def test_states_of_the_document_sharded_order_name_the_key_that_resumes_them(tok):
    sharded = loaders(tok, 2, 1, data_order="document_sharded")
    for loader in sharded:
        next(iter(loader))
    states = [loader.state_dict() for loader in sharded]
    with pytest.raises(ValueError, match=r"per-rank document shards .* set training\.data_order='document_sharded'"):
        loaders(tok, 1, 2)[0].load_state_dict_resharded(states, 0, 1)
    with pytest.raises(ValueError, match=r"set training\.data_order='document_sharded'"):
        loaders(tok, 2, 1)[0].load_state_dict(states[0])
    _, global_states = saved_after(tok, 2, 1, 0, n_steps=1)
    with pytest.raises(ValueError, match=r"layout-invariant order; set training\.data_order='global'"):
        loaders(tok, 1, 2, data_order="document_sharded")[0].load_state_dict_resharded(global_states, 0, 1)


class SeveralRanks:
    """The DataParallelState entries of several dp ranks, saved from one process (as a multi-rank save
    leaves them in the checkpoint)."""

    def __init__(self, ranks):
        self.ranks = [DataParallelState(loader, i, len(ranks)) for i, loader in enumerate(ranks)]

    def state_dict(self):
        return {k: v for rank in self.ranks for k, v in rank.state_dict().items()}


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized")
def test_through_the_checkpoint_manager_on_fewer_ranks(tok, tmp_path):
    config = CheckpointConfig(interval=1, save_rng=False)
    old = loaders(tok, 4, 1)
    head = steps([iter(loader) for loader in old], 1, 2)
    with CheckpointManager(tmp_path, {"dataloader": SeveralRanks(old)}, config) as manager:
        manager.save(2)
    resumed = loaders(tok, 2, 2)
    for rank, loader in enumerate(resumed):
        CheckpointManager(tmp_path, {"dataloader": DataParallelState(loader, rank, 2)}, config).load()
    tail = steps([iter(loader) for loader in resumed], 2, 2)
    assert all(torch.equal(a, b) for a, b in zip(head + tail, stream(tok, 4), strict=True))
