"""Hugging Face safetensors folder -> our model, one tensor at a time, on any parallel layout.

Every rank reads the tensors it holds a part of (memory-mapped, never pickled) and keeps its own shard:
`distribute_tensor(..., src_data_rank=None)` cuts the local piece without communication.
"""

from __future__ import annotations

import json
import os
from collections.abc import Container, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.distributed.tensor import DTensor, distribute_tensor

from titan_checkpoint.errors import CheckpointCorruptError, CheckpointError, CheckpointMismatchError

INDEX_FILE = "model.safetensors.index.json"


@contextmanager
def _open(file: Path):
    try:
        handle = safe_open(str(file), framework="pt", device="cpu")
    except Exception as e:
        raise CheckpointCorruptError(
            f"{file} cannot be opened as safetensors ({type(e).__name__}: {e}); the file is truncated or corrupt"
        ) from e
    with handle as f:
        yield f


def hf_weight_files(folder: str | os.PathLike) -> dict[str, Path]:
    """Hugging Face tensor name -> the file holding it, from the index or, without one, the files."""
    folder = Path(folder)
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as e:
            raise CheckpointCorruptError(f"{index} is not a safetensors index ({type(e).__name__}: {e})") from e
        files = {key: folder / name for key, name in weight_map.items()}
        for file in sorted(set(files.values())):
            if not file.is_file():
                raise CheckpointCorruptError(f"{file} is missing (listed in {index})")
        return files
    found = sorted(folder.glob("*.safetensors"))
    if not found:
        raise CheckpointError(f"{folder} holds no *.safetensors files (nor {INDEX_FILE})")
    files = {}
    for file in found:
        with _open(file) as f:
            files.update(dict.fromkeys(f.keys(), file))
    return files


def load_hf_safetensors(
    folder: str | os.PathLike, adapter: Any, *, only: Container[str] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(our FQN, tensor) for each tensor of a Hugging Face folder, read and converted one at a time.

    adapter: maps HF names and tensors to ours (see titan_checkpoint.adapters). only: FQNs to read (e.g.
    a pipeline stage's); the others are skipped without being read.
    """
    files = hf_weight_files(folder)
    if hasattr(adapter, "hf_keys"):
        missing = [key for key in adapter.hf_keys() if key not in files]
        if missing:
            raise CheckpointMismatchError(
                f"{folder} lacks {len(missing)} tensor(s) the model needs, e.g. {', '.join(missing[:3])}; "
                "is it a checkpoint of this model shape?"
            )
    by_file: dict[Path, list[str]] = {}
    for key, file in files.items():
        by_file.setdefault(file, []).append(key)
    for file, keys in by_file.items():
        with _open(file) as f:
            for hf_key in keys:
                try:
                    fqn = adapter.from_hf_key(hf_key)
                except ValueError as e:
                    raise CheckpointMismatchError(f"{file}: {e}") from e
                if only is not None and fqn not in only:
                    continue
                try:
                    tensor = f.get_tensor(hf_key)
                except Exception as e:
                    raise CheckpointCorruptError(
                        f"{file}: tensor {hf_key!r} cannot be read ({type(e).__name__}: {e}); the file is corrupt"
                    ) from e
                yield fqn, adapter.from_hf_tensor(hf_key, tensor)


@torch.no_grad()
def load_hf_into_model(model: nn.Module | Sequence[nn.Module], folder: str | os.PathLike, adapter: Any) -> None:
    """Copy a Hugging Face folder's weights into `model` (or the model parts of pipeline stages), whose
    parameters may be DTensors of any layout. Every parameter must be found, with its shape."""
    parts = list(model) if isinstance(model, (list, tuple)) else [model]
    targets: dict[str, torch.Tensor] = {}
    for part in parts:
        targets.update(get_model_state_dict(part))
    loaded = set()
    for fqn, tensor in load_hf_safetensors(folder, adapter, only=targets):
        target = targets[fqn]
        if tuple(tensor.shape) != tuple(target.shape):
            raise CheckpointMismatchError(
                f"{folder}: {fqn} has shape {tuple(tensor.shape)} in the Hugging Face files but "
                f"{tuple(target.shape)} in the model; the folder holds a different model shape"
            )
        tensor = tensor.to(device=target.device, dtype=target.dtype)
        if isinstance(target, DTensor):
            local = distribute_tensor(tensor, target.device_mesh, target.placements, src_data_rank=None).to_local()
            target.to_local().copy_(local)
        else:
            target.copy_(tensor)
        loaded.add(fqn)
    missing = sorted(set(targets) - loaded)
    if missing:
        raise CheckpointMismatchError(
            f"{folder} does not hold {len(missing)} parameter(s) of the model, e.g. {', '.join(missing[:3])}"
        )
