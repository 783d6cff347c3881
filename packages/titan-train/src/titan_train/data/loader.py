"""The training dataloader: a GlobalOrderDataset (global_order.py, `training.data_order = "global"`) or a
document-sharded PackedTokenDataset (dataset.py, "document_sharded") behind torchdata's StatefulDataLoader.

`loader.state_dict()` / `loader.load_state_dict()` checkpoint the exact position (per worker when
num_workers > 0), so a resumed run sees the same batches as an uninterrupted one. On another
data-parallel size, `loader.load_state_dict_resharded(states, dp_rank, dp_world_size)` takes the states
of all old ranks instead (titan-checkpoint's DataParallelState calls it): the global order continues at the
next step's first sequence (the states of all ranks hold that one global position), the document-sharded
order with the documents none of the old ranks consumed. In the global order `load_state_dict` also takes
a state of another number of workers, local batch or accumulation.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from titan_train.data.chat_dataset import ChatDataset
from titan_train.data.chat_files import ChatFiles
from titan_train.data.chat_template import load_chat_template
from titan_train.data.dataset import PackedTokenDataset
from titan_train.data.global_order import ORDER, GlobalOrderDataset, check_order, resharded_state
from titan_train.data.sharding import ReaderState, reader_shard
from titan_train.data.sources import resolve_dataset
from titan_train.data.tokenizer import Tokenizer


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
    accumulation_steps: int = 1,
    data_order: str = ORDER,
    chat_packing: str = "pad",
    chat_overlong: str = "truncate",
) -> TokenDataLoader:
    """Batches of (inputs, labels), LongTensors of shape [local_batch_size, seq_len], for one dp rank.

    `seed` shuffles each epoch's document order (within blocks of 1024 documents, the same on every rank);
    None keeps the source's order. `mixture` (training.dataset_mixture) replaces dataset and dataset_path.
    `data_order` (training.data_order): "global", the rank's rows of each global batch of
    local_batch_size x dp_world_size x accumulation_steps sequences, or "document_sharded", sequences packed
    from the rank's own share of documents (accumulation_steps plays no part). `dataset = "chat"`: rows of
    conversations (chat_dataset.py; `chat_packing`, `chat_overlong`), labels ignored but on the assistant's
    tokens, in the global order only.
    """
    for field, value in (("training.seq_len", seq_len), ("training.local_batch_size", local_batch_size)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{field}={value!r} must be a positive integer")
    if not 0 <= dp_rank < dp_world_size:
        raise ValueError(f"dp_rank={dp_rank} must be in [0, dp_world_size={dp_world_size})")
    if data_order not in (ORDER, "document_sharded"):
        raise ValueError(f"training.data_order={data_order!r} must be 'global' or 'document_sharded'")
    if not isinstance(accumulation_steps, int) or accumulation_steps < 1:
        raise ValueError(f"accumulation_steps={accumulation_steps!r} must be a positive integer")
    if num_workers < 0:
        raise ValueError(f"num_workers={num_workers} must be >= 0")
    if mixture and not infinite:
        raise ValueError("training.dataset_mixture is endless (each source cycles); it cannot be read once through")
    source = resolve_dataset(dataset, dataset_path, text_field, mixture)
    if isinstance(source, ChatFiles):
        if data_order != ORDER:
            raise ValueError(_CHAT_ORDER)
        template = load_chat_template(Path(tokenizer.path).parent)
        ds = ChatDataset(
            source, tokenizer, template, seq_len, local_batch_size, packing=chat_packing, overlong=chat_overlong,
            dp_rank=dp_rank, dp_world_size=dp_world_size, accumulation_steps=accumulation_steps, seed=seed,
            infinite=infinite,
        )  # fmt: skip
    elif data_order == ORDER:
        ds = GlobalOrderDataset(
            source, tokenizer, seq_len, local_batch_size, dp_rank, dp_world_size, accumulation_steps, seed, infinite
        )
    else:
        ds = PackedTokenDataset(source, tokenizer, seq_len, dp_rank, dp_world_size, seed=seed, infinite=infinite)
    with warnings.catch_warnings():
        # torchdata 0.11 calls the deprecated torch.set_vital in its constructor; nothing for users to act on.
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
        return TokenDataLoader(ds, batch_size=local_batch_size, num_workers=num_workers, collate_fn=stack_pairs)


_CHAT_ORDER = (
    "training.dataset='chat' reads in the layout-invariant order only; set training.data_order='global' "
    "(conversations are rendered on every reader: chat data sets are small)"
)
_GLOBAL_STATE = (
    "the checkpoint's dataloader state was saved in the layout-invariant order; set training.data_order='global' "
    "to resume it"
)


class TokenDataLoader(StatefulDataLoader):
    """A StatefulDataLoader over a GlobalOrderDataset or PackedTokenDataset that can also resume from another
    dp layout."""

    dataset: GlobalOrderDataset | PackedTokenDataset

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = len(state_dict["_snapshot"]["_worker_snapshots"]) if "_snapshot" in state_dict else 0
        if state_dict and isinstance(self.dataset, GlobalOrderDataset):
            readers = _global_readers(state_dict)
            check_order(readers[0][2])
            geometry = {key: readers[0][2][key] for key in ("global_batch", "local_batch", "dp_world_size")}
            mine = {key: value for key, value in self.dataset.geometry().items() if key in geometry}
            if saved != self.num_workers or geometry != mine:
                self._load_global([readers])
                return
        elif state_dict and "order" in _readers(state_dict)[0].state:
            raise ValueError(_GLOBAL_STATE)
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
        if isinstance(ds, GlobalOrderDataset):
            self._load_global([_global_readers(state) for state in states])
            return
        readers = [reader for state in states for reader in _readers(state)]
        if any("order" in reader.state for reader in readers):
            raise ValueError(_GLOBAL_STATE)
        ds.load_resharded(readers)
        self._restart_workers()

    def _load_global(self, ranks: list[list[tuple[int, int, dict[str, Any]]]]) -> None:
        self.dataset.load_state_dict(resharded_state(ranks, self.dataset))
        self._restart_workers()

    def _restart_workers(self) -> None:
        # As StatefulDataLoader.load_state_dict, but with no state for it to restore: the next iter()
        # starts fresh workers from the dataset's new state.
        self._iterator = None
        self._initial_iter_for_state_dict = False
        self.next_iter_state = None


def _readers(state: dict[str, Any], sharded: bool = True) -> list[ReaderState]:
    """The readers in one rank's StatefulDataLoader state: the rank itself, or each of its workers; indexed
    among all readers of the document-sharded layout (`sharded`), else by worker id among the rank's workers."""
    if "dataset_state" in state:  # num_workers == 0
        ds = state["dataset_state"]
        if not sharded or "order" in ds:
            return [ReaderState(0, 1, ds)]
        return [ReaderState(*reader_shard(ds["dp_rank"], ds["dp_world_size"]), ds)]
    if state.get("_steps_since_snapshot", 0):
        # build_dataloader snapshots the workers' states at every batch; a loader built otherwise may not.
        raise ValueError(
            "the dataloader state has no snapshot of its workers at its last batch "
            "(StatefulDataLoader(snapshot_every_n_steps=1) keeps one); it cannot be resharded"
        )
    workers = state["_snapshot"]["_worker_snapshots"].values()
    return [
        ReaderState(w["worker_id"], len(workers), ds)
        if not sharded or "order" in ds
        else ReaderState(*reader_shard(ds["dp_rank"], ds["dp_world_size"], w["worker_id"], len(workers)), ds)
        for w in workers
        for ds in [w["dataset_state"]]
    ]


def _global_readers(state: dict[str, Any]) -> list[tuple[int, int, dict[str, Any]]]:
    """(worker id, number of workers, dataset state) of each reader in one rank's StatefulDataLoader state."""
    return [(r.index, r.count, r.state) for r in _readers(state, sharded=False)]


def stack_pairs(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    inputs, labels = zip(*samples, strict=True)
    return torch.stack(inputs), torch.stack(labels)
