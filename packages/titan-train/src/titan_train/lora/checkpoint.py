"""The checkpoint manager of a LoRA run: what differs from a full run's is where it starts (a base without
adapters, optionally a peft adapter on it) and what it exports (the merged model, and the adapters for peft)."""

import dataclasses
import logging
import os

from titan_checkpoint import CheckpointManager, complete_steps, is_hf_folder
from titan_checkpoint.location import as_location
from titan_train.config.sections import Lora
from titan_train.lora.base_load import adapters_hidden, holds_adapters
from titan_train.lora.merge import MergedHFAdapter, read_adapters
from titan_train.lora.peft_export import export_peft_adapter
from titan_train.lora.peft_import import load_peft_adapter

logger = logging.getLogger("titan")


def peft_folder(export_folder: str | os.PathLike) -> str:
    """Where the peft adapter goes beside the merged export `export_folder`: `<export_folder>-peft`."""
    return f"{str(export_folder).rstrip('/')}-peft"


class LoRACheckpointManager(CheckpointManager):
    """CheckpointManager for a model with adapters. `lora`: the run's [lora]; `mapping`: makes the model's
    Hugging Face mapping (for peft's names and the export), called when one is needed."""

    def __init__(self, *args, lora: Lora, mapping, **kwargs):
        super().__init__(*args, **kwargs)
        self.lora, self.mapping = lora, mapping

    def load(self, step: int | None = None) -> int:
        """As CheckpointManager's. On a fresh start (no checkpoint in the folder): an initial_load_path without
        adapters loads as the base alone (model only; the adapters keep their fresh values), one with adapters
        (a LoRA run's) loads them too; then lora.initial_adapter_path, if set, replaces the adapters."""
        if step is not None or self.config.load_step >= 0 or complete_steps(self.folder):
            return super().load(step)
        path, config = self.config.initial_load_path, self.config
        if path and not holds_adapters(path, config.initial_load_format):
            logger.info(
                f"lora: {path} holds no adapters: the base loads from it (model only), the adapters start fresh"
            )
            self.config = dataclasses.replace(config, initial_load_model_only=True)
            try:
                with adapters_hidden(self.states["model"].parts):
                    loaded = super().load()
            finally:
                self.config = config
        else:
            loaded = super().load()
        if self.lora.initial_adapter_path:
            load_peft_adapter(self.states["model"].parts, self.lora.initial_adapter_path, self.mapping())
            logger.info(f"lora: adapters from the peft folder {self.lora.initial_adapter_path}")
        return loaded

    def export(self, out: str | os.PathLike, *, step: int | None = None, **kwargs):
        """The merged model (W + B·A·alpha/rank) in Hugging Face layout to `out`, and the adapters in peft's
        layout to peft_folder(out). Call on every rank; rank 0 writes."""
        self.wait()
        adapter_out = peft_folder(out)
        if self.rank == 0:
            adapters = read_adapters(self.folder, step)
            mapping, path = self.mapping(), self.config.initial_load_path
            # peft's config names the base it loads onto: the Hugging Face folder the run started from, if any.
            base = path if path and is_hf_folder(path) else None
            with as_location(adapter_out).written_locally() as local:
                export_peft_adapter(adapters, local, mapping, self.lora, base_model=base)
            self.hf_adapter = MergedHFAdapter(mapping, adapters, self.lora.alpha / self.lora.rank)
        try:
            exported = super().export(out, step=step, **kwargs)
        finally:
            self.hf_adapter = None
        logger.info(
            f"lora: wrote the merged model (adapters folded in) to {out} and the adapters for peft to {adapter_out}"
        )
        return exported
