"""DCP checkpoint manager, one-off checkpoint save/load, and DCP <-> safetensors (Hugging Face layout)
export/import.

Typical use (titan-train does this; every rank runs it)::

    states = {"model": ModelState(model), "optimizer": OptimizerState(model, optimizer),
              "lr_scheduler": lr_scheduler,
              "dataloader": DataParallelState(dataloader, dp_rank, dp_world_size),
              "train_state": train_state}
    manager = CheckpointManager(folder, states, CheckpointConfig(interval=100),
                                fingerprint={"name": "llama3", "flavor": "debug", "args": asdict(args)})
    start = manager.load()                    # latest complete checkpoint, or initial weights, or 0
    for step in range(start + 1, steps + 1):
        ...
        manager.save(step, last=step == steps)
    manager.close()

Without a run to manage (a seed checkpoint, weights for generation), one call each::

    save_checkpoint(folder, 0, {"model": ModelState(model)}, fingerprint=...)   # -> folder/step-0
    step = load_checkpoint(folder, {"model": ModelState(model)})                # latest complete step
"""

from titan_checkpoint.adapters import find_hf_adapter
from titan_checkpoint.config import CheckpointConfig
from titan_checkpoint.errors import CheckpointCorruptError, CheckpointError, CheckpointMismatchError
from titan_checkpoint.folder import complete_steps, latest_step, read_meta
from titan_checkpoint.hf_export import export_safetensors
from titan_checkpoint.hf_import import load_hf_into_model, load_hf_safetensors
from titan_checkpoint.loading import load_checkpoint
from titan_checkpoint.manager import CheckpointManager
from titan_checkpoint.saving import save_checkpoint, save_seed_checkpoint
from titan_checkpoint.states import DataParallelState, ModelState, OptimizerState, RankLocal, RNGState

__version__ = "0.1.0"

__all__ = [
    "CheckpointConfig",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointManager",
    "CheckpointMismatchError",
    "DataParallelState",
    "ModelState",
    "OptimizerState",
    "RNGState",
    "RankLocal",
    "__version__",
    "complete_steps",
    "export_safetensors",
    "find_hf_adapter",
    "latest_step",
    "load_checkpoint",
    "load_hf_into_model",
    "load_hf_safetensors",
    "read_meta",
    "save_checkpoint",
    "save_seed_checkpoint",
]
