"""Tensor parallelism of a model with adapters: the base stays frozen and the adapters split like their layer.

torch's styles make every parameter they split a new, trainable one: each plan entry is wrapped so that what was
frozen stays frozen. A column-wise layer (weight [out, in] split over `out`) sees the whole input and gives each
rank a slice of the output features: its A (rank x in) stays whole (replicated) and its B (out x rank) is split
over `out` like the base weight, so B·A·x lands on the same output slice. A row-wise layer (weight split over
`in`) sees a slice of the input features and sums partial outputs: its A is split over `in` like the base weight
(A·x is then a partial sum, reduced with the base's output) and its B stays whole.
"""

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from titan_train.lora.adapters import ADAPTERS


class AdaptedParallel(ParallelStyle):
    """`base` on the module, its frozen parameters kept frozen, and a linear layer's adapters split to match."""

    def __init__(self, base: ParallelStyle):
        super().__init__()
        self.base = base

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        frozen = {name for name, param in module.named_parameters() if not param.requires_grad}
        if all(name in module._modules for name in ADAPTERS):
            module = self._apply_with_adapters(module, device_mesh)
        else:
            module = self.base._apply(module, device_mesh)
        for name, param in module.named_parameters():
            if name in frozen:
                param.requires_grad_(False)
        return module

    def _apply_with_adapters(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if isinstance(self.base, ColwiseParallel):
            placements = {"lora_A": Replicate(), "lora_B": Shard(0)}
        elif isinstance(self.base, RowwiseParallel):
            placements = {"lora_A": Shard(1), "lora_B": Replicate()}
        else:
            raise ValueError(
                f"lora: a layer with adapters is tensor-parallel by {type(self.base).__name__}, but adapters follow "
                "only column- or row-wise layers; leave this layer out of lora.target_modules"
            )
        # The base style treats every module under the layer as a linear layer to split: it must see none of the
        # adapters' (A, B, dropout).
        children = {name: module._modules.pop(name) for name in list(module._modules)}
        module = self.base._apply(module, device_mesh)
        for name, child in children.items():
            if name in placements:
                weight = distribute_tensor(child.weight, device_mesh, [placements[name]])
                child.weight = nn.Parameter(weight, requires_grad=child.weight.requires_grad)
            module.register_module(name, child)
        return module


def lora_tp_plan(plan: dict) -> dict:
    """`plan` with every torch style wrapped in AdaptedParallel. (Declared styles, plain data titan-parallel
    turns into styles, stay as they are: init_adapters then refuses a base they left trainable.)"""
    return {fqn: AdaptedParallel(style) if isinstance(style, ParallelStyle) else style for fqn, style in plan.items()}
