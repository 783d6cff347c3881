"""Hugging Face safetensors folder -> our model, one tensor at a time, on any parallel layout.

Every rank reads the tensors it holds a part of (memory-mapped, never pickled) and keeps its own shard:
`distribute_tensor(..., src_data_rank=None)` cuts the local piece without communication. A tensor Hugging
Face stores once for two of our names (tied embeddings: the adapter's aliases()) fills both. When the
folder has a config.json, the model it describes must be the one being loaded (shape, RoPE, tying), or
the load is refused before any tensor is read. Tensors stored in MXFP4 (a blocks and a scales tensor in place of
one, GPT-OSS's published experts) are dequantized as they are read (hf_mxfp4.py).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Container, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.distributed.tensor import DTensor, distribute_tensor

from titan_checkpoint.adapters import model_differences, read_hf_config
from titan_checkpoint.errors import CheckpointCorruptError, CheckpointError, CheckpointMismatchError
from titan_checkpoint.hf_fused import fused_hf_keys
from titan_checkpoint.hf_mxfp4 import dequantize_mxfp4, mxfp4_pairs
from titan_checkpoint.location import as_location

logger = logging.getLogger("titan.checkpoint")

INDEX_FILE = "model.safetensors.index.json"


def is_hf_folder(path: str | os.PathLike) -> bool:
    """Whether `path` (a local folder or an object-store URL) is a Hugging Face model folder (config.json and
    safetensors files)."""
    names = {name for name, is_folder in as_location(path).list_dir() if not is_folder}
    return "config.json" in names and any(name.endswith(".safetensors") for name in names)


def local_hf_folder(path: str | os.PathLike) -> AbstractContextManager[Path]:
    """The Hugging Face folder `path` as a local folder: itself, or an object-store one downloaded to a
    temporary folder (removed afterwards), since safetensors maps its files from local disk."""
    return as_location(path).local_copy()


def check_hf_model(folder: str | os.PathLike, adapter: Any) -> None:
    """Refuse a folder whose config.json describes another model than `adapter`'s; the error lists each
    differing key. Without config.json (or an adapter class that cannot read one) there is nothing to check."""
    if not (Path(folder) / "config.json").is_file() or not hasattr(type(adapter), "from_hf_config"):
        return
    try:
        theirs = type(adapter).from_hf_config(read_hf_config(folder))
    except (ValueError, KeyError) as e:
        raise CheckpointMismatchError(f"{folder}/config.json cannot be read as this model's config: {e}") from e
    differences = model_differences(adapter, theirs)
    if differences:
        raise CheckpointMismatchError(
            f"{folder} holds another model than the one it is loaded into: {'; '.join(differences)} (ours: the "
            f"model being loaded, theirs: {folder}/config.json); choose the matching model.flavor"
        )


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
    folder: str | os.PathLike,
    adapter: Any,
    *,
    only: Container[str] | None = None,
    mxfp4_dtype: torch.dtype = torch.float32,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(our FQN, tensor) for each tensor of a Hugging Face folder, read and converted one at a time; a
    tensor shared by several of our FQNs (adapter.aliases()) comes once per FQN, as the same tensor; one
    of ours stacked from several (adapter.stacked_hf_keys(fqn), e.g. experts) comes once all are read; one HF
    tensor that holds two of ours (adapter.fused_hf_keys(), e.g. GPT-OSS's gate_up_proj) gives both (hf_fused.py).

    adapter: maps HF names and tensors to ours (see titan_checkpoint.adapters). only: FQNs to read (e.g.
    a pipeline stage's); the others are skipped without being read. mxfp4_dtype: of the tensors the folder stores
    in MXFP4 (X_blocks and X_scales instead of X: the published GPT-OSS experts, hf_mxfp4.py), dequantized on
    reading and from then on treated as X; the other tensors come as stored.
    """
    files = hf_weight_files(folder)
    needed = set(adapter.hf_keys()) if hasattr(adapter, "hf_keys") else None
    # X stored as X_blocks + X_scales (possibly in two files) stands under X from here on; read() dequantizes it.
    mxfp4: dict[str, tuple[str, Path, str, Path]] = {}
    for key, (blocks, scales) in mxfp4_pairs(files, needed, str(folder)).items():
        mxfp4[key] = (blocks, files.pop(blocks), scales, files.pop(scales))
        files[key] = mxfp4[key][1]
    dequantized = 0

    def read(f: Any, file: Path, hf_key: str) -> torch.Tensor:
        nonlocal dequantized
        if hf_key not in mxfp4:
            return _get_tensor(f, file, hf_key)
        dequantized += 1
        return _read_mxfp4(*mxfp4[hf_key], mxfp4_dtype)

    if hasattr(adapter, "skips_hf_key"):
        skipped = sorted(key for key in files if adapter.skips_hf_key(key))
        if skipped:
            logger.info(f"checkpoint: {folder}: {len(skipped)} tensor(s) the model does not read, e.g. {skipped[0]}")
        files = {key: file for key, file in files.items() if not adapter.skips_hf_key(key)}
    aliases = adapter.aliases() if hasattr(adapter, "aliases") else {}
    # A tied folder may store the shared tensor under both names; ours reads it once, under its own.
    fused = fused_hf_keys(adapter)
    files = {key: file for key, file in files.items() if key in fused or not _is_alias_key(adapter, key, aliases)}
    if needed is not None:
        missing = [key for key in adapter.hf_keys() if key not in files]
        if missing:
            raise CheckpointMismatchError(
                f"{folder} lacks {len(missing)} tensor(s) the model needs, e.g. {', '.join(missing[:3])}; "
                "is it a checkpoint of this model shape?"
            )
    pending: dict[str, dict[str, torch.Tensor]] = {}
    by_file: dict[Path, list[str]] = {}
    for key, file in files.items():
        by_file.setdefault(file, []).append(key)
    for file, keys in by_file.items():
        with _open(file) as f:
            for hf_key in keys:
                if hf_key in fused:
                    yield from _read_fused(partial(read, f, file, hf_key), fused[hf_key], adapter, aliases, only)
                    continue
                try:
                    fqn = adapter.from_hf_key(hf_key)
                except ValueError as e:
                    raise CheckpointMismatchError(f"{file}: {e}") from e
                names = [fqn, *(alias for alias, source in aliases.items() if source == fqn)]
                names = [name for name in names if only is None or name in only]
                if not names:
                    continue
                tensor = adapter.from_hf_tensor(hf_key, read(f, file, hf_key))
                stacked = adapter.stacked_hf_keys(fqn) if hasattr(adapter, "stacked_hf_keys") else None
                if stacked is not None:  # one slice of ours (e.g. one expert): stacked once all are read
                    slices = pending.setdefault(fqn, {})
                    slices[hf_key] = tensor
                    if len(slices) < len(stacked):
                        continue
                    tensor = torch.stack([slices[key] for key in stacked])
                    del pending[fqn]
                for name in names:
                    yield name, tensor
    if pending:
        fqn, slices = next(iter(pending.items()))
        missing = [key for key in adapter.stacked_hf_keys(fqn) if key not in slices]
        raise CheckpointMismatchError(f"{folder} lacks {', '.join(missing[:3])} (part of our {fqn})")
    if dequantized:
        logger.info(
            f"checkpoint: {folder}: {dequantized} tensor(s) dequantized from MXFP4 to {mxfp4_dtype}; an export "
            "writes them unquantized, in the export's dtype"
        )


def _get_tensor(f: Any, file: Path, hf_key: str) -> torch.Tensor:
    try:
        return f.get_tensor(hf_key)
    except Exception as e:
        raise CheckpointCorruptError(
            f"{file}: tensor {hf_key!r} cannot be read ({type(e).__name__}: {e}); the file is corrupt"
        ) from e


def _read_mxfp4(blocks: str, blocks_file: Path, scales: str, scales_file: Path, dtype: torch.dtype) -> torch.Tensor:
    with _open(blocks_file) as f:
        packed = _get_tensor(f, blocks_file, blocks)
    with _open(scales_file) as f:
        exponents = _get_tensor(f, scales_file, scales)
    try:
        return dequantize_mxfp4(packed, exponents, dtype)
    except ValueError as e:
        raise CheckpointMismatchError(f"{blocks_file}: {blocks} and {scales}: {e}") from e


def _read_fused(
    read: Callable[[], torch.Tensor],
    pair: tuple[str, str],
    adapter: Any,
    aliases: dict[str, str],
    only: Container[str] | None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(our FQN, tensor) for each of the two tensors the fused Hugging Face tensor (`read()`) holds (and their
    aliases) that `only` accepts; unread if it accepts neither."""
    names = {fqn: [n for n in (fqn, *(a for a, s in aliases.items() if s == fqn)) if only is None or n in only]
             for fqn in pair}  # fmt: skip
    if not any(names.values()):
        return
    halves = adapter.split_from_hf(read())
    for fqn, half in zip(pair, halves, strict=True):
        for name in names[fqn]:
            yield name, half


def _is_alias_key(adapter: Any, hf_key: str, aliases: dict[str, str]) -> bool:
    try:
        return adapter.from_hf_key(hf_key) in aliases
    except ValueError:
        return False


@torch.no_grad()
def load_hf_into_model(model: nn.Module | Sequence[nn.Module], folder: str | os.PathLike, adapter: Any) -> None:
    """Copy a Hugging Face folder's weights into `model` (or the model parts of pipeline stages), whose
    parameters may be DTensors of any layout. Every parameter must be found, with its shape, and the
    folder's config.json (if any) must describe the adapter's model."""
    check_hf_model(folder, adapter)
    parts = list(model) if isinstance(model, (list, tuple)) else [model]
    targets: dict[str, torch.Tensor] = {}
    for part in parts:
        targets.update(get_model_state_dict(part))
    loaded = set()
    # MXFP4 tensors dequantize straight into the model's dtype where it has one (bf16: half the memory of fp32).
    dtypes = {target.dtype for target in targets.values() if target.is_floating_point()}
    mxfp4_dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
    for fqn, tensor in load_hf_safetensors(folder, adapter, only=targets, mxfp4_dtype=mxfp4_dtype):
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
