"""LoRA after another conversion (float8's): one converter for titan-parallel's build_parallel_model."""

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from titan_train.config.sections import Lora
from titan_train.lora.adapters import apply_lora
from titan_train.lora.tensor_parallel import lora_tp_plan


class LoRAConverter:
    """`inner`'s conversion, then adapters on the layers `options.target_modules` names. After: the float8
    swap sees no adapter (they stay in high precision) and the base it built is what gets frozen."""

    def __init__(self, inner, options: Lora):
        self.inner, self.options = inner, options
        self.targets: list[str] = []

    def convert(self, model: nn.Module) -> None:
        self.inner.convert(model)
        o = self.options
        self.targets = apply_lora(model, o.rank, o.alpha, o.dropout, o.target_modules)

    def tp_plan(self, plan: dict, model: nn.Module, tp_mesh: DeviceMesh) -> dict:
        return lora_tp_plan(self.inner.tp_plan(plan, model, tp_mesh))

    def after_optimizer_step(self, parts: list[nn.Module]) -> None:
        self.inner.after_optimizer_step(parts)


def with_lora(converter, options: Lora):
    """`converter`, with LoRA after it when `options.enable`."""
    return LoRAConverter(converter, options) if options.enable else converter
