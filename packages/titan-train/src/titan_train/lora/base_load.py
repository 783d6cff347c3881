"""A LoRA model started from a base that has no adapters (a checkpoint of a run without LoRA, a Hugging Face
folder): the base's weights load, the adapters keep the values init_adapters drew (B zero: the model starts as
its base, as peft's does)."""

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from titan_checkpoint import is_hf_folder, model_tensor_names
from titan_train.lora.adapters import is_adapter_name


def holds_adapters(path: str, load_format: str = "dcp") -> bool:
    """Whether the checkpoint at `path` (a step folder or a folder of steps) holds LoRA adapters; a Hugging
    Face folder never does. Reads the DCP metadata only."""
    if load_format == "hf" or is_hf_folder(path):
        return False
    return any(is_adapter_name(fqn) for fqn in model_tensor_names(path))


@contextmanager
def adapters_hidden(parts: list[nn.Module]) -> Iterator[None]:
    """The model parts seen as their base: every adapted layer's adapter modules are unregistered for the
    duration, so a state dict (a checkpoint load, a Hugging Face load) names the base's tensors only. Nothing
    runs the model meanwhile: the forward hook would miss them."""
    saved = []
    for part in parts:
        for module in part.modules():
            if "lora_A" in module._modules:
                saved.append((module, dict(module._modules)))
                for name in ("lora_dropout", "lora_A", "lora_B"):
                    del module._modules[name]
    try:
        yield
    finally:
        for module, children in saved:
            module._modules.clear()
            module._modules.update(children)
