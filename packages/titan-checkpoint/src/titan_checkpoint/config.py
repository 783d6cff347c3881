"""CheckpointConfig: the `[checkpoint]` options the manager acts on (the trainer resolves `enable` and
`folder` itself and passes the folder to CheckpointManager)."""

from __future__ import annotations

from dataclasses import dataclass, field

from titan_checkpoint.location import check_location

ASYNC_MODES = ("disabled", "async", "async_with_pinned_mem")
LOAD_FORMATS = ("dcp", "hf")
EXPORT_DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class CheckpointConfig:
    interval: int = 500
    """Save every `interval` steps (and at the last step). 0 saves only at the last step."""
    keep_latest_k: int = 10
    """Keep this many newest complete checkpoints, deleting older ones after each save; 0 keeps all."""
    async_mode: str = "disabled"
    """disabled: save blocks the step. async: copy the state to CPU memory, write it in a background
    thread while training continues. async_with_pinned_mem: as async, copying into pinned memory on a side
    stream (only with an accelerator; on CPU it runs as async, saying so)."""
    load_step: int = -1
    """Step to resume from; -1 means the latest complete checkpoint in the folder."""
    model_only: bool = False
    """The final checkpoint holds only the model weights, in export_dtype (for evaluation or export);
    interval checkpoints stay complete so training can resume from them."""
    export_dtype: str = "float32"
    """dtype of the model weights in a model-only final checkpoint: float32, bfloat16 or float16."""
    exclude_from_loading: list[str] = field(default_factory=list)
    """State names not restored on load (e.g. ["dataloader"] to restart the data order)."""
    initial_load_path: str | None = None
    """Weights to start from when the folder holds no checkpoint: a DCP checkpoint (a step folder or a
    folder of steps) or a Hugging Face folder (config.json + safetensors, recognized whatever
    initial_load_format says; its config.json must describe the run's model). A local path or an
    object-store URL (s3://bucket/prefix)."""
    initial_load_format: str = "dcp"
    """Format of initial_load_path: dcp or hf (Hugging Face safetensors, converted by the model's adapter)."""
    initial_load_model_only: bool = True
    """From a DCP initial_load_path, load only the model (fine-tuning); False restores every state."""
    check_fingerprint: bool = True
    """Refuse a checkpoint written for a different model config (False: warn and try to load it)."""
    verify_checksums: bool = True
    """Check every file's CRC-32 before loading (ranks share the reading); sizes are always checked."""
    save_rng: bool = True
    """Save and restore each rank's RNG states (torch CPU/accelerator, Python random)."""

    def validate(self) -> None:
        """Raise ValueError naming the first bad field, its value and what is allowed."""
        if self.async_mode not in ASYNC_MODES:
            raise ValueError(f"checkpoint.async_mode={self.async_mode!r}; use one of {', '.join(ASYNC_MODES)}")
        if self.initial_load_format not in LOAD_FORMATS:
            raise ValueError(
                f"checkpoint.initial_load_format={self.initial_load_format!r}; use one of {', '.join(LOAD_FORMATS)}"
            )
        if self.export_dtype not in EXPORT_DTYPES:
            raise ValueError(f"checkpoint.export_dtype={self.export_dtype!r}; use one of {', '.join(EXPORT_DTYPES)}")
        for name in ("interval", "keep_latest_k"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"checkpoint.{name}={value!r} must be an integer >= 0")
        check_location(self.initial_load_path, "checkpoint.initial_load_path")
        if not isinstance(self.load_step, int) or self.load_step < -1:
            raise ValueError(f"checkpoint.load_step={self.load_step!r} must be -1 (latest) or a step >= 0")
