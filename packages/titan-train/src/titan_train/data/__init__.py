"""Training data: document sources, packing into fixed-length samples, the stateful dataloader."""

from titan_train.data.checks import check_dataset
from titan_train.data.dataset import PackedTokenDataset
from titan_train.data.global_order import GlobalOrderDataset
from titan_train.data.loader import TokenDataLoader, build_dataloader
from titan_train.data.sources import DocumentSource, resolve_dataset

__all__ = [
    "DocumentSource",
    "GlobalOrderDataset",
    "PackedTokenDataset",
    "TokenDataLoader",
    "build_dataloader",
    "check_dataset",
    "resolve_dataset",
]
