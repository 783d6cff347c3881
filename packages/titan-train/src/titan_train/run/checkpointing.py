"""The trainer's side of checkpointing: which states go into a checkpoint, where, and the seed checkpoint."""

import dataclasses
import logging
import os

from torch import nn
from torch.distributed.checkpoint.stateful import Stateful

from titan_checkpoint import (
    CheckpointManager,
    DataParallelState,
    ModelState,
    OptimizerState,
    complete_steps,
    save_seed_checkpoint,
)
from titan_checkpoint.location import scheme
from titan_models import get_model_spec
from titan_parallel import ParallelDims
from titan_train.config import ConfigError, JobConfig
from titan_train.lora.checkpoint import LoRACheckpointManager
from titan_train.run.optim import LRSchedulers, Optimizers

logger = logging.getLogger("titan")


def resolve_folder(config: JobConfig, folder: str) -> str:
    """A relative local folder is under job.dump_folder; absolute paths and object-store URLs are as given."""
    if os.path.isabs(folder) or scheme(folder) is not None:
        return folder
    return os.path.join(config.job.dump_folder, folder)


# Fields added to a model's args after checkpoints were written, with the value those checkpoints had:
# left out of the fingerprint at that value, so the older checkpoints still match.
_ADDED_ARGS = {"tie_word_embeddings": False, "mtp_layers": 0}


def fingerprint(config: JobConfig, model_args) -> dict:
    """What a checkpoint must match to be loaded: the model's name, flavor and architecture. max_seq_len is
    left out: it follows training.seq_len, which may change between runs without changing the weights."""
    args = {
        k: v
        for k, v in dataclasses.asdict(model_args).items()
        if k != "max_seq_len" and not (k in _ADDED_ARGS and v == _ADDED_ARGS[k])
    }
    return {"name": config.model.name, "flavor": config.model.flavor, "args": args}


def model_meta(config: JobConfig, model_args) -> dict:
    """What the model is, stored with each checkpoint (never compared), so the export and titan-generate
    rebuild it from the checkpoint alone: complete args (max_seq_len included) and the tokenizer."""
    tokenizer = config.model.tokenizer_path
    return {
        "name": config.model.name,
        "flavor": config.model.flavor,
        "args": dataclasses.asdict(model_args),
        # "" is the tokenizer shipped with titan-train.
        "tokenizer": os.path.abspath(os.path.expanduser(tokenizer)) if tokenizer else "",
    }


def run_states(
    model_parts: list[nn.Module],
    optimizer: Optimizers,
    lr_scheduler: LRSchedulers,
    dataloader: Stateful,
    train_state: Stateful,
) -> dict[str, Stateful]:
    """This rank's states of a run, by the names a checkpoint stores them under: what a checkpoint saves and
    what a restarted replica group copies from a live one. `train_state`: the step counter's owner."""
    return {
        # One entry for all of this rank's pipeline stages: keys are the plain model's, whatever the layout.
        "model": ModelState(model_parts),
        "optimizer": OptimizerState(model_parts, optimizer.optimizers),
        "lr_scheduler": lr_scheduler,
        "dataloader": dataloader,
        "train_state": train_state,
    }


class NoCheckpoint:
    """What the trainer holds when checkpointing is off: every call of CheckpointManager's that the loop makes,
    doing nothing, so the loop reads the same either way."""

    loaded_from = None

    def load(self) -> bool:
        return False

    def save(self, step: int, last: bool = False) -> None:
        pass

    def wait_for_staging(self) -> None:
        pass

    def close(self) -> None:
        pass

    def export(self, *args, **kwargs) -> None:
        pass  # export_safetensors without checkpoint.enable is refused when the config is read


def build_checkpoint_manager(
    config: JobConfig, dims: ParallelDims, model_args, states: dict[str, Stateful]
) -> CheckpointManager | NoCheckpoint:
    """The manager over a run's `states` (run_states); a NoCheckpoint when checkpointing is off. `model_args`:
    the model's, for the fingerprint a resume is checked against."""
    if not config.checkpoint.enable or config.checkpoint.create_seed_checkpoint:
        return NoCheckpoint()
    # Ranks that read the same data (tp, cp, pp peers) share one entry; a different dp size reshards.
    states = {**states, "dataloader": DataParallelState(states["dataloader"], dims.local_rank("dp"), dims.dp)}
    layout = {k: getattr(dims, k) for k in ("dp_replicate", "dp_shard", "cp", "tp", "pp")}
    lora = {}
    if config.lora.enable:  # starts from a base without adapters, exports the merged model and the adapters
        manager = LoRACheckpointManager
        lora = {"lora": config.lora, "mapping": lambda: get_model_spec(config.model.name).hf_adapter(model_args)}
    else:
        manager = CheckpointManager
    return manager(
        resolve_folder(config, config.checkpoint.folder),
        states,
        config.checkpoint,
        fingerprint=fingerprint(config, model_args),
        layout=layout,
        model_meta=model_meta(config, model_args),
        **lora,
    )


def write_seed_checkpoint(config: JobConfig, model: nn.Module, model_args) -> str:
    folder = resolve_folder(config, config.checkpoint.folder)
    if complete_steps(folder):
        raise ConfigError(
            f"checkpoint.create_seed_checkpoint: {folder} already holds checkpoints (steps {complete_steps(folder)}); "
            "choose another checkpoint.folder or job.dump_folder so nothing is overwritten"
        )
    seed = save_seed_checkpoint(
        folder, model, fingerprint=fingerprint(config, model_args), model_meta=model_meta(config, model_args)
    )
    return str(seed)
