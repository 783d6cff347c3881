"""Resuming the document-sharded dataloader (training.data_order = "document_sharded"; the global order's
resume is in test_data_global_order.py) on another data-parallel size: every document of every epoch is trained on
exactly once, whole, across the old and the new layout; the old ranks' leftover tokens come first on the
new rank they are handed to; the same layout still resumes bit-identically.

Documents name themselves: a tokenizer that reads the text's integers gives document d of epoch e the tokens
BOS, 1000 + e, 100 + d, 2 x length(d), EOS (the epoch is added to the text by wrapping epoch_documents).
Each rank's (each worker's) token stream is rebuilt from its windows plus its final token buffer, and cut
into documents; each must be complete and appear once.
"""

import collections
import json
from itertools import islice

import pytest
import torch

import titan_train.data.dataset as dataset_module
from titan_checkpoint import CheckpointConfig, CheckpointManager, DataParallelState
from titan_train.data import build_dataloader

BOS, EOS, FILLER = 0, 1, 2
NUM_DOCS = 20


class IdTokenizer:
    bos_id, eos_id = BOS, EOS

    def encode_batch(self, texts):
        return [[BOS, *map(int, text.split()), EOS] for text in texts]


def length(doc: int, skewed: bool) -> int:
    # skewed: rank 0 of 2 gets the short documents and runs epochs ahead of rank 1
    return (1 if doc % 2 == 0 else 12) if skewed else (doc * 7) % 11


def doc_tokens(epoch: int, doc: int, skewed: bool) -> list[int]:
    return [BOS, 1000 + epoch, 100 + doc, *[FILLER] * length(doc, skewed), EOS]


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    """Builds loaders over NUM_DOCS documents: make(dp_rank, dp_world_size, num_workers, skewed)."""
    real = dataset_module.epoch_documents
    monkeypatch.setattr(
        dataset_module,
        "epoch_documents",
        lambda source, epoch, start=0, seed=None: (
            (p, f"{1000 + epoch} {t}") for p, t in real(source, epoch, start, seed)
        ),
    )

    def make(dp_rank, dp_world_size, num_workers=0, skewed=False):
        path = tmp_path / f"docs_{skewed}.jsonl"
        if not path.exists():
            lines = [json.dumps({"text": f"{100 + d} " + "2 " * length(d, skewed)}) for d in range(NUM_DOCS)]
            path.write_text("\n".join(lines) + "\n")
        return build_dataloader(
            "text",
            str(path),
            IdTokenizer(),
            seq_len=8,
            local_batch_size=2,
            dp_rank=dp_rank,
            dp_world_size=dp_world_size,
            num_workers=num_workers,
            seed=None if skewed else 5,
            data_order="document_sharded",
        )

    return make


def reader_states(loader_state: dict) -> list[dict]:
    """The dataset state of each reader of a rank (the rank, or each of its workers), by worker id."""
    if "dataset_state" in loader_state:
        return [loader_state["dataset_state"]]
    workers = loader_state["_snapshot"]["_worker_snapshots"]
    return [workers[f"worker_{w}"]["dataset_state"] for w in range(len(workers))]


def run(loader, num_workers: int, *, batches: int | None = None, until_epoch: int | None = None):
    """Batches from a fresh iterator until `batches` or every reader reaches `until_epoch`; returns each
    reader's token stream (its windows + final buffer), its final buffer, and the loader's state."""
    streams = [[] for _ in range(max(num_workers, 1))]
    it = iter(loader)
    for i in range(10_000):
        state = loader.state_dict()
        if i == batches or (until_epoch is not None and all(s["epoch"] >= until_epoch for s in reader_states(state))):
            break
        inputs, labels = next(it)
        for x, y in zip(inputs, labels, strict=True):  # a fresh iterator takes batch i from worker i % workers
            streams[i % len(streams)] += x.tolist() + y[-1:].tolist()
    buffers = [s["token_buffer"] for s in reader_states(state)]
    return [s + b for s, b in zip(streams, buffers, strict=True)], buffers, state


def count_documents(stream: list[int], seen: collections.Counter, skewed: bool) -> None:
    starts = [i for i, t in enumerate(stream) if t == BOS] + [len(stream)]
    assert starts[0] == 0, f"stream starts inside a document: {stream[:20]}"
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        epoch, doc = stream[a + 1] - 1000, stream[a + 2] - 100
        assert stream[a:b] == doc_tokens(epoch, doc, skewed), f"document {doc} of epoch {epoch} is not whole"
        seen[epoch, doc] += 1


def check_layouts(make, layouts, skewed, batches=(7,)):
    """Run each (dp size, workers) layout in turn, resharding from the previous one, for `batches[phase]`
    batches per rank; the last runs past the latest epoch any earlier reader reached. Every document is
    then seen once per epoch."""
    seen = collections.Counter()
    old_buffers: list[list[int]] = []  # by old reader index
    old_states: list[dict] = []
    latest = 0  # the latest epoch any reader has reached
    for phase, (world, workers) in enumerate(layouts):
        last = phase == len(layouts) - 1
        until = latest + 2
        states = []
        new_buffers = [[] for _ in range(world * max(workers, 1))]
        for rank in range(world):
            loader = make(rank, world, workers, skewed)
            if old_states:
                loader.load_state_dict_resharded(old_states, rank, world)
            stop = {"until_epoch": until} if last else {"batches": batches[phase]}
            streams, buffers, state = run(loader, workers, **stop)
            for w, (stream, buffer) in enumerate(zip(streams, buffers, strict=True)):
                # Old reader i's leftovers go to new rank i % world, whose first reader emits them first.
                handed = [t for i, b in enumerate(old_buffers) if i % world == rank and w == 0 for t in b]
                assert stream[: len(handed)] == handed
                count_documents(stream[len(handed) :], seen, skewed)
                new_buffers[rank + world * w] = buffer
            states.append(state)
            latest = max([latest] + [s["epoch"] for s in reader_states(state)])
        old_buffers, old_states = new_buffers, states
        if phase == 0:
            assert any(old_buffers), "no leftover tokens to hand over: the test would not check them"
    assert max(seen.values()) == 1, [k for k, v in seen.items() if v > 1]
    # Every last reader reached epoch `until`: it has taken all of its documents of the epochs before.
    missing = [(e, d) for e in range(until) for d in range(NUM_DOCS) if (e, d) not in seen]
    assert not missing, missing
    return seen


@pytest.mark.parametrize("skewed", [False, True], ids=["shuffled", "ranks_epochs_apart"])
@pytest.mark.parametrize("layouts", [[(2, 0), (1, 0)], [(2, 0), (3, 0)], [(2, 0), (4, 0)], [(4, 0), (2, 0)]])
def test_new_dp_size_consumes_every_document_once(corpus, layouts, skewed):
    check_layouts(corpus, layouts, skewed)


def test_ranks_in_different_epochs_at_save(corpus):
    loaders = [corpus(rank, 2, skewed=True) for rank in range(2)]
    epochs = [run(loader, 0, batches=7)[2]["dataset_state"]["epoch"] for loader in loaders]
    assert epochs[0] >= epochs[1] + 2  # the premise of the skewed cases above


def test_reshard_twice_and_with_workers(corpus):
    # Saved again after one batch: the second layout still skips what the first one had consumed.
    check_layouts(corpus, [(2, 0), (3, 0), (2, 0)], skewed=True, batches=(7, 1))
    check_layouts(corpus, [(2, 2), (3, 1)], skewed=False, batches=(5,))
    check_layouts(corpus, [(1, 2), (2, 0), (3, 2)], skewed=True, batches=(7, 1))


def stripes_after_reshard(corpus, rank, world, batches=0):
    old = [run(corpus(r, 2, skewed=True), 0, batches=7)[2] for r in range(2)]
    resumed = corpus(rank, world, skewed=True)
    resumed.load_state_dict_resharded(old, rank, world)
    _, _, state = run(resumed, 0, batches=batches)
    return resumed, state["dataset_state"]["skip"]


def test_state_stays_small(corpus):
    resumed, stripes = stripes_after_reshard(corpus, 1, 3, batches=1)
    assert 0 < len(stripes) <= 8, stripes  # a few per old rank (and epoch it was ahead), not one per document
    _, _, state = run(resumed, 0, until_epoch=max(s[0] for s in stripes) + 1)
    assert state["dataset_state"]["skip"] == []  # gone once passed

    # Old rank 0 (even positions) ran ahead; new rank 1 of 4 reads odd positions only and drops its stripes.
    assert stripes_after_reshard(corpus, 1, 4)[1] == []
    stripes = stripes_after_reshard(corpus, 0, 4)[1]
    assert stripes and all(every == 2 and offset == 0 for *_, every, offset in stripes), stripes


def test_incomplete_old_layout_is_refused(corpus):
    old = [run(corpus(0, 2), 0, batches=2)[2]]
    with pytest.raises(ValueError, match=r"not those of one complete layout: readers \[0\] of \[2\]"):
        corpus(0, 3).load_state_dict_resharded(old, 0, 3)
    with pytest.raises(
        ValueError, match=r"resharded load for data-parallel rank 1 of 3, but this dataloader is rank 0"
    ):
        corpus(0, 3).load_state_dict_resharded(old, 1, 3)


def test_same_dp_size_with_another_number_of_workers_says_so(corpus):
    state = run(corpus(0, 2, num_workers=1), 1, batches=1)[2]
    with pytest.raises(ValueError, match=r"saved with 1 workers but this dataloader has 0; .*num_workers = 1"):
        corpus(0, 2).load_state_dict(state)


class SeveralRanks:
    """The DataParallelState entries of several dp ranks, saved from one process (as a multi-rank save
    leaves them in the checkpoint)."""

    def __init__(self, loaders):
        self.ranks = [DataParallelState(loader, i, len(loaders)) for i, loader in enumerate(loaders)]

    def state_dict(self):
        return {k: v for rank in self.ranks for k, v in rank.state_dict().items()}


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized")
def test_through_the_checkpoint_manager(corpus, tmp_path):
    config = CheckpointConfig(interval=1, save_rng=False)
    first = [corpus(rank, 2) for rank in range(2)]
    references = [list(islice(corpus(rank, 2), 8)) for rank in range(2)]
    for loader in first:
        list(islice(loader, 5))
    with CheckpointManager(tmp_path, {"dataloader": SeveralRanks(first)}, config) as manager:
        manager.save(1)

    # Same dp size: each rank continues exactly where it stopped.
    for rank in range(2):
        loader = corpus(rank, 2)
        CheckpointManager(tmp_path, {"dataloader": DataParallelState(loader, rank, 2)}, config).load()
        for got, want in zip(islice(loader, 3), references[rank][5:], strict=True):
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])

    # Another dp size: the new ranks start where the old ones left off, leftovers first.
    old_states = [loader.state_dict() for loader in first]
    for rank in range(3):
        loader, direct = corpus(rank, 3), corpus(rank, 3)
        CheckpointManager(tmp_path, {"dataloader": DataParallelState(loader, rank, 3)}, config).load()
        direct.load_state_dict_resharded(old_states, rank, 3)
        for got, want in zip(islice(loader, 4), islice(direct, 4), strict=True):
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
