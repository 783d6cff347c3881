"""Our DCP checkpoint -> Hugging Face layout, as `transformers`, vLLM and TGI read it: model.safetensors
(or model-0000N-of-0000M.safetensors shards and their index past max_shard_size), config.json (shape,
context length, RoPE scaling, token ids, dtype), generation_config.json and the tokenizer files (see
hf_tokenizer.py), in one dtype.

Streams: the shard plan comes from the DCP metadata alone (names, shapes, dtypes), then each tensor is
read on its own (`dcp.load` of a one-entry state dict, which reassembles a tensor saved in shards by any
number of ranks), converted by the adapter and added to the current shard; a shard is written and freed
as soon as it is full. Peak memory: about one shard plus one tensor (two of ours and their Hugging Face tensor
where it holds both: the adapter's fused_hf_keys(), hf_fused.py). Progress is logged as it goes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from titan_checkpoint.adapters import adapter_from_meta
from titan_checkpoint.errors import CheckpointCorruptError, CheckpointError, CheckpointMismatchError
from titan_checkpoint.folder import checkpoint_location, read_meta
from titan_checkpoint.hf_fused import fused_hf_keys, fused_key_of
from titan_checkpoint.hf_import import INDEX_FILE
from titan_checkpoint.hf_tokenizer import ExportedTokenizer
from titan_checkpoint.location import Location, as_location
from titan_checkpoint.model_tensors import Entry, model_tensors
from titan_checkpoint.progress import ByteProgress
from titan_checkpoint.storage import (
    SafeFileSystemReader,
    SafeFsspecReader,
    SafeLoadPlanner,
    checkpoint_reader,
    read_dcp_metadata,
    verify_files,
)

logger = logging.getLogger("titan.checkpoint")

SINGLE_FILE = "model.safetensors"
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def is_stacked(adapter: Any, fqn: str) -> bool:
    """Whether our tensor `fqn` is several Hugging Face tensors stacked on a new first dimension (the
    adapter's optional stacked_hf_keys, e.g. a mixture of experts' 3-D weights)."""
    return hasattr(adapter, "stacked_hf_keys") and adapter.stacked_hf_keys(fqn) is not None


def hf_names(adapter: Any, fqn: str) -> list[str]:
    """The Hugging Face names of our tensor `fqn`: one, or one per slice of a stacked tensor."""
    return adapter.stacked_hf_keys(fqn) if is_stacked(adapter, fqn) else [adapter.to_hf_key(fqn)]


def parse_size(size: int | str) -> int:
    """Bytes from 5000000, "5GB" (10**9, as Hugging Face counts) or "4GiB" (2**30)."""
    if isinstance(size, int):
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", size)
    if not match or match.group(2).upper() not in _UNITS:
        raise ValueError(f"max_shard_size={size!r}: use a byte count or e.g. '5GB', '500MB', '2GiB'")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def _dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"dtype={dtype!r} is not a torch dtype; use e.g. bfloat16, float16 or float32")
    return value


def _read_tensor(
    reader: SafeFileSystemReader | SafeFsspecReader, key: str, info: TensorStorageMetadata
) -> torch.Tensor:
    tensor = torch.empty(info.size, dtype=info.properties.dtype)
    dcp.load({key: tensor}, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=True)
    return tensor


def _shard_plan(numels: list[int], itemsize: int, max_bytes: int, repeats: list[int]) -> list[list[int]]:
    """Unit indices per shard, from sizes alone, so every file name knows the total count. numels: the elements
    of each unit; repeats: how many times each unit is written (1 + its copies)."""
    shards: list[list[int]] = [[]]
    shard_bytes = 0
    for i, numel in enumerate(numels):
        nbytes = numel * itemsize * repeats[i]
        if shards[-1] and shard_bytes + nbytes > max_bytes:
            shards.append([])
            shard_bytes = 0
        shards[-1].append(i)
        shard_bytes += nbytes
    return shards


def _units(checkpoint: Location, adapter: Any, entries: list[Entry]) -> list[tuple[tuple[str, ...], list[str]]]:
    """(our FQNs, their Hugging Face keys) per unit of conversion, in saved order: one of ours and its one key (or
    one per slice of a stacked tensor), or the two of ours one fused key holds (at the place of the first)."""
    fused = fused_hf_keys(adapter)
    fused_key, saved = fused_key_of(fused), {fqn for fqn, _, _ in entries}
    units, done = [], set()
    for fqn, _, _ in entries:
        hf_key = fused_key.get(fqn)
        if hf_key is None:
            units.append(((fqn,), hf_names(adapter, fqn)))
        elif hf_key not in done:
            done.add(hf_key)
            absent = [half for half in fused[hf_key] if half not in saved]
            if absent:
                raise CheckpointMismatchError(
                    f"{checkpoint} holds {fqn} but not {absent[0]}: Hugging Face's {hf_key} holds both"
                )
            units.append((fused[hf_key], [hf_key]))
    return units


def _hf_tensors(adapter: Any, fqns: tuple[str, ...], ours: list[torch.Tensor], fused: bool) -> list[torch.Tensor]:
    """Our tensors of one unit (see _units) as its Hugging Face tensors, in its keys' order."""
    if fused:
        return [adapter.merge_to_hf(*ours)]
    (fqn,), (tensor,) = fqns, ours
    # A stacked tensor (e.g. experts [E, ...]) is one Hugging Face tensor per slice.
    pieces = list(tensor) if is_stacked(adapter, fqn) else [tensor]
    return [adapter.to_hf_tensor(fqn, piece) for piece in pieces]


def _recorded_tokenizer(checkpoint: Location, meta: dict[str, Any]) -> Path | None:
    """The tokenizer the checkpoint's model description names (a path; relative ones are beside the steps),
    if it is there."""
    recorded = (meta.get("model") or {}).get("tokenizer")
    if not recorded:
        return None  # none recorded, or the trainer's shipped tokenizer, which only titan-train knows
    beside = checkpoint.parent.local_path
    path = Path(recorded) if Path(recorded).is_absolute() or beside is None else beside / recorded
    return path if path.exists() else None


def export_safetensors(
    checkpoint: str | os.PathLike,
    out: str | os.PathLike,
    *,
    adapter: Any = None,
    model_name: str | None = None,
    dtype: torch.dtype | str = torch.bfloat16,
    max_shard_size: int | str = "50GB",
    tokenizer: str | os.PathLike | None = None,
    overwrite: bool = False,
) -> Path | str:
    """Write the model of `checkpoint` (a step folder, or a folder of steps -> the latest) to `out` in
    Hugging Face layout. adapter: default from the checkpoint's metadata (model_name overrides its
    "name"), found through the titan.hf_adapters entry points. tokenizer: a tokenizer.json (its folder's
    tokenizer_config.json comes with it) or a folder of tokenizer files, by default the one the checkpoint
    records; its BOS / EOS ids go into config.json and generation_config.json. One file, model.safetensors,
    unless the tensors pass max_shard_size. `checkpoint` and `out` may be object-store URLs (an export to
    one is written locally, then uploaded). Returns `out`."""
    checkpoint, out, dtype = checkpoint_location(checkpoint), as_location(out), _dtype(dtype)
    max_bytes = parse_size(max_shard_size)
    if out.list_dir() and not overwrite:
        raise CheckpointError(f"export destination {out} exists and is not empty; choose another or pass overwrite")
    with out.written_locally() as local:
        _export(checkpoint, local, adapter, model_name, dtype, max_bytes, tokenizer)
    return out.plain


def _export(
    checkpoint: Location,
    out: Path,
    adapter: Any,
    model_name: str | None,
    dtype: torch.dtype,
    max_bytes: int,
    tokenizer: str | os.PathLike | None,
) -> Path:
    meta = read_meta(checkpoint)
    if adapter is None:
        adapter = adapter_from_meta(meta, model_name)
    tokenizer = tokenizer if tokenizer is not None else _recorded_tokenizer(checkpoint, meta)
    exported_tokenizer = None if tokenizer is None else ExportedTokenizer(tokenizer)
    metadata = read_dcp_metadata(checkpoint)
    problems = verify_files(checkpoint, metadata, meta.get("files"))
    if problems:
        raise CheckpointCorruptError(f"checkpoint {checkpoint} is damaged: {'; '.join(problems)}")

    # Tied tensors (an alias of another FQN) are stored once, under the name Hugging Face gives it.
    aliases = adapter.aliases() if hasattr(adapter, "aliases") else {}
    entries = [entry for entry in model_tensors(metadata) if entry[0] not in aliases]
    if not entries:
        raise CheckpointMismatchError(f"{checkpoint} holds no model tensors (no keys under 'model.')")
    units = _units(checkpoint, adapter, entries)
    hf_keys = [keys for _, keys in units]
    if hasattr(adapter, "hf_keys"):
        missing = sorted(set(adapter.hf_keys()) - {key for keys in hf_keys for key in keys})
        if missing:
            raise CheckpointMismatchError(f"{checkpoint} lacks {len(missing)} model tensor(s), e.g. {missing[:3]}")

    # Tensors some readers expect under a second name too (the adapter's hf_copies(): DeepSeek-V3's MTP layer's
    # embedding and head), written beside their source in the same file.
    copies_of: dict[str, list[str]] = {}
    for copy_key, source in (adapter.hf_copies() if hasattr(adapter, "hf_copies") else {}).items():
        copies_of.setdefault(source, []).append(copy_key)
    repeats = [1 + sum(len(copies_of.get(key, [])) for key in keys) for keys in hf_keys]
    itemsize = torch.empty((), dtype=dtype).element_size()
    saved = {fqn: (key, info) for fqn, key, info in entries}
    numels = [sum(saved[fqn][1].size.numel() for fqn in fqns) for fqns, _ in units]
    shards = _shard_plan(numels, itemsize, max_bytes, repeats)
    total_bytes = sum(numel * n for numel, n in zip(numels, repeats, strict=True)) * itemsize
    progress = ByteProgress(total_bytes, f"exporting to {out}")
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    reader = checkpoint_reader(checkpoint)
    weight_map, total = {}, 0
    for n, members in enumerate(shards, start=1):
        name = SINGLE_FILE if len(shards) == 1 else f"model-{n:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for i in members:
            fqns = units[i][0]
            ours = [_read_tensor(reader, *saved[fqn]) for fqn in fqns]
            converted = _hf_tensors(adapter, fqns, ours, fused=len(fqns) > 1)
            del ours
            for hf_key, tensor in zip(hf_keys[i], converted, strict=True):
                tensor = tensor.to(dtype).contiguous()
                # safetensors refuses tensors sharing memory: each copy is its own.
                for key in (hf_key, *copies_of.get(hf_key, [])):
                    tensors[key] = tensor if key == hf_key else tensor.clone()
                    weight_map[key] = name
                    total += tensor.numel() * itemsize
                    progress.add(tensor.numel() * itemsize)
        save_file(tensors, str(tmp / name), metadata={"format": "pt"})
        del tensors
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (tmp / INDEX_FILE).write_text(json.dumps(index, indent=2))
    token_ids = {}
    if exported_tokenizer is not None:
        token_ids = {"bos_token_id": exported_tokenizer.bos_id, "eos_token_id": exported_tokenizer.eos_token_id}
    config = adapter.hf_config(dtype, **{k: v for k, v in token_ids.items() if v is not None})
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if exported_tokenizer is not None:
        exported_tokenizer.write(tmp, model_max_length=config.get("max_position_embeddings", 0))
    else:
        logger.warning(
            "checkpoint: exported without a tokenizer: config.json names no BOS/EOS token and there is no "
            "generation_config.json, so generate() will not stop at EOS; pass the tokenizer (--tokenizer PATH)"
        )
    if out.exists():
        shutil.rmtree(out)
    os.rename(tmp, out)
    seconds = time.perf_counter() - progress.start
    logger.info(
        f"checkpoint: exported {checkpoint} to {out} ({len(weight_map)} tensors, {total / 1e9:.2f} GB in "
        f"{len(shards)} file(s), all {dtype}, none quantized: MXFP4 experts imported from a folder are not "
        f"re-quantized, {seconds:.1f}s)"
    )
    return out
