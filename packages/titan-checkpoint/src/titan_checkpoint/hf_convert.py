"""A Hugging Face model folder -> a DCP checkpoint (`titan-checkpoint import HF_DIR OUT`).

The model comes from the folder's config.json alone (its adapter found by `architectures`); the result is
`OUT/step-0`, model only, which `checkpoint.initial_load_path` (or a run resuming in OUT) loads on any
parallel layout: DCP reshards. The folder's tokenizer files go to OUT/tokenizer. titan_meta.json carries
the model's description ("model": name and complete args) so titan-generate and the export need nothing
else; it has no fingerprint, so a run checks the model by what it is (its config.json fields) rather
than by flavor name.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from titan_checkpoint.adapters import adapter_from_hf_folder
from titan_checkpoint.errors import CheckpointError
from titan_checkpoint.folder import complete_steps
from titan_checkpoint.hf_export import _dtype
from titan_checkpoint.hf_import import hf_weight_files, load_hf_safetensors, local_hf_folder
from titan_checkpoint.hf_tokenizer import TOKENIZER_FILES
from titan_checkpoint.location import Location, as_location
from titan_checkpoint.progress import ByteProgress
from titan_checkpoint.saving import save_checkpoint

logger = logging.getLogger("titan.checkpoint")

TOKENIZER_DIR = "tokenizer"


class _Tensors:
    """A plain dict of tensors as a Stateful "model" state."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.tensors

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        raise NotImplementedError("an import only writes")


def _tensor_bytes(files: set[Path]) -> int:
    """The tensor bytes the safetensors files hold, from their headers (8-byte length, then JSON)."""
    total = 0
    for file in files:
        with open(file, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        total += sum(end - start for key, entry in header.items() if key != "__metadata__"
                     for start, end in [entry["data_offsets"]])  # fmt: skip
    return total


def import_hf_checkpoint(
    folder: str | os.PathLike, out: str | os.PathLike, *, dtype: torch.dtype | str | None = None
) -> Path | str:
    """Write the Hugging Face model in `folder` as the DCP checkpoint `out/step-0` and return its path.
    dtype: of the written tensors (default: as stored in the folder). Either may be an object-store URL."""
    source, out = as_location(folder), as_location(out)
    if complete_steps(out):
        raise CheckpointError(f"import destination {out} already holds checkpoints; choose an empty folder")
    with local_hf_folder(source) as local:
        return _import(local, source, out, dtype)


def _import(folder: Path, source: Location, out: Location, dtype: torch.dtype | str | None) -> Path | str:
    name, adapter = adapter_from_hf_folder(folder)
    cast = None if dtype is None else _dtype(dtype)
    # Every tensor in memory at once: DCP writes one state dict. Tied tensors are held once, named twice.
    progress = ByteProgress(_tensor_bytes(set(hf_weight_files(folder).values())), f"importing {folder}")
    tensors = {}
    # MXFP4 tensors have no stored float dtype: bf16, the published folders' other one, holds their values exactly.
    for fqn, tensor in load_hf_safetensors(folder, adapter, mxfp4_dtype=cast or torch.bfloat16):
        if all(tensor is not seen for seen in tensors.values()):  # a tied tensor comes again under its alias
            progress.add(tensor.numel() * tensor.element_size())
        tensors[fqn] = tensor
    if cast is not None:
        tensors = {fqn: tensor.to(cast) for fqn, tensor in tensors.items()}
    args = adapter.args_dict() if hasattr(adapter, "args_dict") else None
    model = {"name": name, "args": args, "source": source.record_name()}
    tokenizer_files = [folder / n for n in TOKENIZER_FILES if (folder / n).is_file()]
    if tokenizer_files:
        # Beside the steps, so the checkpoint alone can be generated from; the path is relative to `out`.
        out.join(TOKENIZER_DIR).make_dirs()
        for file in tokenizer_files:
            with out.join(TOKENIZER_DIR, file.name).open_file("wb") as copy:
                copy.write(file.read_bytes())
        model["tokenizer"] = TOKENIZER_DIR
    path = save_checkpoint(out, 0, {"model": _Tensors(tensors)}, model=model)
    logger.info(f"checkpoint: imported {source} ({name}, {len(tensors)} tensors) as {path}")
    return path
