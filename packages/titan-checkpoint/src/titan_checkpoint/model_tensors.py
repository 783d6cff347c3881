"""A checkpoint's model tensors by name, read outside any run: on the calling process, with no model built and
no process group (a LoRA run reads its adapters this way to export them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from titan_checkpoint.folder import Folder, checkpoint_location, step_dir
from titan_checkpoint.storage import SafeLoadPlanner, checkpoint_reader, read_dcp_metadata

Entry = tuple[str, str, TensorStorageMetadata]
"""(our FQN, DCP key, storage metadata) of one model tensor."""


def model_tensors(metadata: Any) -> list[Entry]:
    """(our FQN, DCP key, storage metadata) of every model tensor of a checkpoint, in saved order."""
    paths = metadata.planner_data or {}
    entries = []
    for key, info in metadata.state_dict_metadata.items():
        path = paths.get(key, tuple(key.split(".", 1)))
        if isinstance(info, TensorStorageMetadata) and len(path) == 2 and path[0] == "model":
            entries.append((path[1], key, info))
    return entries


def model_tensor_names(checkpoint: Folder) -> list[str]:
    """Our FQNs of the model tensors a checkpoint holds, in saved order. `checkpoint`: a step-<N> folder, a
    folder of them (the latest complete one) or a plain DCP folder. Reads the DCP metadata only."""
    return [fqn for fqn, _, _ in model_tensors(read_dcp_metadata(checkpoint_location(checkpoint)))]


def read_model_tensors(
    checkpoint: Folder, names: Callable[[str], bool], *, step: int | None = None
) -> dict[str, torch.Tensor]:
    """{our FQN: whole tensor} of the model tensors whose FQN `names` accepts, reading those tensors only.
    `checkpoint` as model_tensor_names's; with `step`, a folder of steps and the step to read."""
    location = checkpoint_location(checkpoint) if step is None else step_dir(checkpoint, step)
    entries = [entry for entry in model_tensors(read_dcp_metadata(location)) if names(entry[0])]
    tensors = {key: torch.empty(info.size, dtype=info.properties.dtype) for _, key, info in entries}
    if tensors:
        dcp.load(tensors, storage_reader=checkpoint_reader(location), planner=SafeLoadPlanner(), no_dist=True)
    return {fqn: tensors[key] for fqn, key, _ in entries}
