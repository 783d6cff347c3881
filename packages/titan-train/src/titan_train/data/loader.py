"""The training dataloader: a PackedTokenDataset behind torchdata's StatefulDataLoader.

`loader.state_dict()` / `loader.load_state_dict()` checkpoint the exact position (per worker when
num_workers > 0), so a resumed run sees the same batches as an uninterrupted one. On another
data-parallel size, `loader.load_state_dict_resharded(states, dp_rank, dp_world_size)` takes the states
of all old ranks instead (titan-checkpoint's DataParallelState calls it) and continues with the documents
none of them consumed.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from titan_train.data.dataset import PackedTokenDataset
from titan_train.data.sharding import ReaderState, reader_shard
from titan_train.data.sources import resolve_dataset
from titan_train.tokenizer import Tokenizer


def build_dataloader(
    dataset: str | None,
    dataset_path: str | None,
    tokenizer: Tokenizer,
    seq_len: int,
    local_batch_size: int,
    dp_rank: int = 0,
    dp_world_size: int = 1,
    num_workers: int = 0,
    seed: int | None = None,
    infinite: bool = True,
    text_field: str = "text",
    mixture: list[dict] | None = None,
) -> TokenDataLoader:
    """Batches of (inputs, labels), LongTensors of shape [local_batch_size, seq_len], for one dp rank.

    `seed` shuffles each epoch's document order (within blocks of 1024 documents, the same on every rank);
    None keeps the source's order. `mixture` (training.dataset_mixture) replaces dataset and dataset_path.
    """
    for field, value in (("training.seq_len", seq_len), ("training.local_batch_size", local_batch_size)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{field}={value!r} must be a positive integer")
    if not 0 <= dp_rank < dp_world_size:
        raise ValueError(f"dp_rank={dp_rank} must be in [0, dp_world_size={dp_world_size})")
    if num_workers < 0:
        raise ValueError(f"num_workers={num_workers} must be >= 0")
    if mixture and not infinite:
        raise ValueError("training.dataset_mixture is endless (each source cycles); it cannot be read once through")
    source = resolve_dataset(dataset, dataset_path, text_field, mixture)
    ds = PackedTokenDataset(source, tokenizer, seq_len, dp_rank, dp_world_size, seed=seed, infinite=infinite)
    with warnings.catch_warnings():
        # torchdata 0.11 calls the deprecated torch.set_vital in its constructor; nothing for users to act on.
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
        return TokenDataLoader(ds, batch_size=local_batch_size, num_workers=num_workers, collate_fn=stack_pairs)


class TokenDataLoader(StatefulDataLoader):
    """A StatefulDataLoader over a PackedTokenDataset that can also resume from another dp layout."""

    dataset: PackedTokenDataset

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = len(state_dict["_snapshot"]["_worker_snapshots"]) if "_snapshot" in state_dict else 0
        if state_dict and saved != self.num_workers:
            raise ValueError(
                f"the dataloader state was saved with {saved} workers but this dataloader has {self.num_workers}; "
                f"set training.dataloader_num_workers = {saved} to resume"
            )
        super().load_state_dict(state_dict)

    def load_state_dict_resharded(self, states: list[dict[str, Any]], dp_rank: int, dp_world_size: int) -> None:
        """Resume from `states`, the `state_dict()` of each old data-parallel rank (states[i] of rank i),
        saved on another data-parallel size or number of workers. Takes effect at the next `iter()`."""
        ds = self.dataset
        if (dp_rank, dp_world_size) != (ds.dp_rank, ds.dp_world_size):
            raise ValueError(
                f"resharded load for data-parallel rank {dp_rank} of {dp_world_size}, but this dataloader "
                f"is rank {ds.dp_rank} of {ds.dp_world_size}"
            )
        ds.load_resharded([reader for state in states for reader in _readers(state)])
        # As StatefulDataLoader.load_state_dict, but with no state for it to restore: the next iter()
        # starts fresh workers from the dataset's new state.
        self._iterator = None
        self._initial_iter_for_state_dict = False
        self.next_iter_state = None


def _readers(state: dict[str, Any]) -> list[ReaderState]:
    """The readers in one rank's StatefulDataLoader state: the rank itself, or each of its workers."""
    if "dataset_state" in state:  # num_workers == 0
        ds = state["dataset_state"]
        return [ReaderState(*reader_shard(ds["dp_rank"], ds["dp_world_size"]), ds)]
    if state.get("_steps_since_snapshot", 0):
        # build_dataloader snapshots the workers' states at every batch; a loader built otherwise may not.
        raise ValueError(
            "the dataloader state has no snapshot of its workers at its last batch "
            "(StatefulDataLoader(snapshot_every_n_steps=1) keeps one); it cannot be resharded"
        )
    workers = state["_snapshot"]["_worker_snapshots"].values()
    return [
        ReaderState(*reader_shard(ds["dp_rank"], ds["dp_world_size"], w["worker_id"], len(workers)), ds)
        for w in workers
        for ds in [w["dataset_state"]]
    ]


def stack_pairs(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    inputs, labels = zip(*samples, strict=True)
    return torch.stack(inputs), torch.stack(labels)
