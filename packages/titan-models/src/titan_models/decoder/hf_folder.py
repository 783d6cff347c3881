"""A Hugging Face folder's multi-token prediction layers as its weights hold them, from tensor names alone (the
safetensors index, or each file's header), no tensor read.

config.json's `num_nextn_predict_layers` says how many MTP layers (model.layers.<num_hidden_layers + k - 1>) a
DeepSeek-V3 folder has, but transformers writes its DeepseekV3Config default, 1, into every folder it saves, MTP
weights or not. So a folder's MTP layers are those its config declares and its weights hold; a folder without
weight files (a shape to train from scratch) has those its config declares.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import struct
from pathlib import Path

from titan_models.decoder.args import DecoderArgs

logger = logging.getLogger("titan")

INDEX_FILE = "model.safetensors.index.json"


def hf_tensor_names(folder: str | Path) -> set[str]:
    """Every tensor name of the folder's safetensors files: the index's, or each file's header's (the 8-byte
    little-endian header length, then the header's JSON)."""
    folder = Path(folder)
    index = folder / INDEX_FILE
    if index.is_file():
        return set(json.loads(index.read_text())["weight_map"])
    names: set[str] = set()
    for file in sorted(folder.glob("*.safetensors")):
        with file.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            names |= set(json.loads(f.read(size))) - {"__metadata__"}
    return names


def with_mtp_layers_held(args: DecoderArgs, folder: str | Path) -> DecoderArgs:
    """`args` (read from the folder's config.json) with mtp_layers the MTP layers the folder's weights hold: the
    declared ones up to the first without any tensor."""
    names = hf_tensor_names(folder)
    if not args.mtp_layers or not names:
        return args
    held = 0
    while held < args.mtp_layers and any(name.startswith(f"model.layers.{args.n_layers + held}.") for name in names):
        held += 1
    if held < args.mtp_layers:
        _log_fewer_held(str(folder), args.mtp_layers, held, args.n_layers + held)
    return dataclasses.replace(args, mtp_layers=held)


@functools.cache
def _log_fewer_held(folder: str, declared: int, held: int, first_missing: int) -> None:
    # Once per folder: a run reads its flavor more than once (layout, trainer, checkpoint).
    logger.info(
        f"{folder}: config.json declares num_nextn_predict_layers={declared} but the weights hold {held} MTP "
        f"layer(s) (none under model.layers.{first_missing}.*; transformers writes 1 into every DeepSeek-V3 folder "
        f"it saves): the model has mtp_layers={held}"
    )
