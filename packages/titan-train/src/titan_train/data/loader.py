"""The training dataloader: a PackedTokenDataset behind torchdata's StatefulDataLoader.

`loader.state_dict()` / `loader.load_state_dict()` checkpoint the exact position (per worker when
num_workers > 0), so a resumed run sees the same batches as an uninterrupted one.
"""

from __future__ import annotations

import warnings

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from titan_train.data.dataset import PackedTokenDataset
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
) -> StatefulDataLoader:
    """Batches of (inputs, labels), LongTensors of shape [local_batch_size, seq_len], for one dp rank.

    `seed` shuffles each epoch's document order (within blocks of 1024 documents, the same on every rank);
    None keeps the source's order.
    """
    for field, value in (("training.seq_len", seq_len), ("training.local_batch_size", local_batch_size)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{field}={value!r} must be a positive integer")
    if not 0 <= dp_rank < dp_world_size:
        raise ValueError(f"dp_rank={dp_rank} must be in [0, dp_world_size={dp_world_size})")
    if num_workers < 0:
        raise ValueError(f"num_workers={num_workers} must be >= 0")
    source = resolve_dataset(dataset, dataset_path)
    ds = PackedTokenDataset(source, tokenizer, seq_len, dp_rank, dp_world_size, seed=seed, infinite=infinite)
    with warnings.catch_warnings():
        # torchdata 0.11 calls the deprecated torch.set_vital in its constructor; nothing for users to act on.
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
        return StatefulDataLoader(ds, batch_size=local_batch_size, num_workers=num_workers, collate_fn=stack_pairs)


def stack_pairs(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    inputs, labels = zip(*samples, strict=True)
    return torch.stack(inputs), torch.stack(labels)
