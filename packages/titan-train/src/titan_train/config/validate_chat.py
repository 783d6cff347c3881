"""Checks of the chat data settings (`training.dataset = "chat"`, docs/fine-tuning.md), before anything is built."""

from pathlib import Path

from titan_train.config.loader import ConfigError
from titan_train.config.sections import JobConfig


def validate_chat(config: JobConfig) -> None:
    t, m, p = config.training, config.model, config.parallelism
    if any(isinstance(entry, dict) and entry.get("dataset") == "chat" for entry in t.dataset_mixture):
        raise ConfigError(
            "training.dataset_mixture has a 'chat' entry; conversations are not mixed with documents: set "
            "training.dataset='chat' and training.dataset_path to the conversations instead"
        )
    if t.dataset != "chat" and config.validation.dataset != "chat":
        return
    if t.data_order != "global":
        raise ConfigError(
            f"training.data_order={t.data_order!r} with training.dataset='chat': conversations are read in the "
            "layout-invariant order only; set training.data_order='global'"
        )
    for key in ("pipeline_parallel_degree", "context_parallel_degree"):
        degree = getattr(p, key)
        if t.dataset == "chat" and degree > 1:
            raise ConfigError(
                f"parallelism.{key}={degree} with training.dataset='chat': the loss is normalised over the "
                "assistant tokens of the global batch by weighting each micro-batch's mean, and pipeline "
                "micro-batches and context-parallel shards take their own means; not supported yet: set it to 1 "
                "and use data and tensor parallelism"
            )
    if t.chat_packing == "pack" and (m.attention_mask, m.positions) != ("block_causal", "document"):
        raise ConfigError(
            f"training.chat_packing='pack' with model.attention_mask={m.attention_mask!r} and model.positions="
            f"{m.positions!r}: packed conversations would attend to each other; set model.attention_mask="
            "'block_causal' and model.positions='document', or training.chat_packing='pad'"
        )
    from titan_train.data.chat_template import load_chat_template
    from titan_train.data.tokenizer import load_tokenizer

    try:
        load_chat_template(Path(load_tokenizer(m.tokenizer_path or None).path).parent)
    except (ValueError, OSError) as e:
        raise ConfigError(f"training.dataset='chat': {e}") from None
