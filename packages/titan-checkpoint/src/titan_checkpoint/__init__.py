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
    resolve_checkpoint(folder)                                                  # -> folder/step-<latest>

A checkpoint's model tensors by name, on one process, no model built (a LoRA run's adapters)::

    model_tensor_names(folder)                                  # our FQNs, from the DCP metadata alone
    read_model_tensors(folder, lambda fqn: "lora_" in fqn)      # {FQN: whole tensor}, reading those only

Hugging Face layout, both ways (the model's adapter is found through the titan.hf_adapters entry points)::

    export_safetensors(checkpoint, "hf", dtype="bfloat16", tokenizer="tokenizer.json")  # transformers loads it
    import_hf_checkpoint("Llama-3.2-1B", "ckpt")        # -> ckpt/step-0, the model from its config.json
"""

from titan_checkpoint.adapters import adapter_from_hf_folder, adapter_from_meta, find_hf_adapter, model_description
from titan_checkpoint.config import CheckpointConfig
from titan_checkpoint.errors import CheckpointCorruptError, CheckpointError, CheckpointMismatchError
from titan_checkpoint.folder import complete_steps, latest_step, read_meta, resolve_checkpoint
from titan_checkpoint.hf_convert import import_hf_checkpoint
from titan_checkpoint.hf_export import export_safetensors
from titan_checkpoint.hf_import import is_hf_folder, load_hf_into_model, load_hf_safetensors
from titan_checkpoint.loading import load_checkpoint
from titan_checkpoint.location import check_location
from titan_checkpoint.manager import CheckpointManager
from titan_checkpoint.model_tensors import model_tensor_names, read_model_tensors
from titan_checkpoint.saving import save_checkpoint, save_seed_checkpoint
from titan_checkpoint.states import DataParallelState, ModelState, OptimizerState, RankLocal, RNGState

__version__ = "0.12.0"

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
    "adapter_from_hf_folder",
    "adapter_from_meta",
    "check_location",
    "complete_steps",
    "export_safetensors",
    "find_hf_adapter",
    "import_hf_checkpoint",
    "is_hf_folder",
    "latest_step",
    "load_checkpoint",
    "load_hf_into_model",
    "load_hf_safetensors",
    "model_description",
    "model_tensor_names",
    "read_meta",
    "read_model_tensors",
    "resolve_checkpoint",
    "save_checkpoint",
    "save_seed_checkpoint",
]
