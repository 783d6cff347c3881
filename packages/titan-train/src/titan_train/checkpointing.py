"""The trainer's side of checkpointing: which states go into a checkpoint, where, and the seed checkpoint."""

import dataclasses
import os

from titan_checkpoint import (
    CheckpointManager,
    DataParallelState,
    ModelState,
    OptimizerState,
    complete_steps,
    save_seed_checkpoint,
)
from titan_train.config import ConfigError, JobConfig


def resolve_folder(config: JobConfig, folder: str) -> str:
    return folder if os.path.isabs(folder) else os.path.join(config.job.dump_folder, folder)


def fingerprint(config: JobConfig, model_args) -> dict:
    """What a checkpoint must match to be loaded: the model's name, flavor and architecture. max_seq_len is
    left out: it follows training.seq_len, which may change between runs without changing the weights."""
    args = {k: v for k, v in dataclasses.asdict(model_args).items() if k != "max_seq_len"}
    return {"name": config.model.name, "flavor": config.model.flavor, "args": args}


def build_checkpoint_manager(trainer) -> CheckpointManager | None:
    """The manager over the trainer's states; None when checkpointing is off."""
    config = trainer.config
    if not config.checkpoint.enable or config.checkpoint.create_seed_checkpoint:
        return None
    dims = trainer.dims
    states = {
        # One entry for all of this rank's pipeline stages: keys are the plain model's, whatever the layout.
        "model": ModelState(trainer.model_parts),
        "optimizer": OptimizerState(trainer.model_parts, trainer.optimizer.optimizers),
        "lr_scheduler": trainer.lr_scheduler,
        # Ranks that read the same data (tp, cp, pp peers) share one entry; a different dp size reshards.
        "dataloader": DataParallelState(trainer.dataloader, dims.local_rank("dp"), dims.dp),
        "train_state": trainer,
    }
    layout = {k: getattr(dims, k) for k in ("dp_replicate", "dp_shard", "cp", "tp", "pp")}
    return CheckpointManager(
        resolve_folder(config, config.checkpoint.folder),
        states,
        config.checkpoint,
        fingerprint=fingerprint(config, trainer.model_args),
        layout=layout,
    )


def write_seed_checkpoint(trainer) -> str:
    folder = resolve_folder(trainer.config, trainer.config.checkpoint.folder)
    if complete_steps(folder):
        raise ConfigError(
            f"checkpoint.create_seed_checkpoint: {folder} already holds checkpoints (steps {complete_steps(folder)}); "
            "choose another checkpoint.folder or job.dump_folder so nothing is overwritten"
        )
    return str(save_seed_checkpoint(folder, trainer.model, fingerprint=fingerprint(trainer.config, trainer.model_args)))
