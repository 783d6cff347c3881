"""The run's dataloader arguments, read from the config in one place: training's, and validation's on top."""

from typing import Any

from titan_train.config import JobConfig
from titan_train.data.tokenizer import Tokenizer


def training_dataloader_args(
    config: JobConfig, tokenizer: Tokenizer, dp_rank: int, dp_world_size: int, accumulation_steps: int
) -> dict[str, Any]:
    """build_dataloader's arguments for this data-parallel rank's training batches."""
    t = config.training
    return dict(
        dataset=t.dataset,
        dataset_path=t.dataset_path,
        text_field=t.dataset_text_field,
        mixture=t.dataset_mixture,
        tokenizer=tokenizer,
        seq_len=t.seq_len,
        local_batch_size=t.local_batch_size,
        dp_rank=dp_rank,
        dp_world_size=dp_world_size,
        num_workers=t.dataloader_num_workers,
        seed=t.seed,
        accumulation_steps=accumulation_steps,
        data_order=t.data_order,
        chat_packing=t.chat_packing,
        chat_overlong=t.chat_overlong,
    )


def validation_dataloader_args(
    config: JobConfig, tokenizer: Tokenizer, dp_rank: int, dp_world_size: int, accumulation_steps: int
) -> dict[str, Any]:
    """build_dataloader's arguments for this rank's validation batches: laid out as the training data (text
    field, order, accumulation), from validation's own dataset, in the source's order so every evaluation sees
    the same batches, in the main process."""
    v, t = config.validation, config.training
    return {
        **training_dataloader_args(config, tokenizer, dp_rank, dp_world_size, accumulation_steps),
        "dataset": v.dataset,
        "dataset_path": v.dataset_path,
        "mixture": None,
        "seq_len": t.seq_len if v.seq_len == -1 else v.seq_len,
        "local_batch_size": t.local_batch_size if v.local_batch_size == -1 else v.local_batch_size,
        "num_workers": 0,
        "seed": None,
        "infinite": v.steps != -1,
    }
