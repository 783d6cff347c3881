"""Float8 as one object a parallelizer calls at its three moments: swap the Linear layers first, adapt the
tensor-parallel plan to them, and precompute the weights' scales after each optimizer step.

It has the shape of titan_parallel's `ModelConverter` (the packages share no import):

    converter = Float8Converter(options)
    model = build_parallel_model(..., converter=converter)    # convert -> ... -> tp_plan -> ...
    optimizer.step(); model.after_optimizer_step()            # one all-reduce for every weight's scale
"""

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule

from titan_float8.async_tp import offer_async_tp_matmuls
from titan_float8.convert import Float8Options, convert_to_float8
from titan_float8.fsdp import precompute_float8_scales
from titan_float8.tensor_parallel import float8_tp_plan


class Float8Converter:
    def __init__(
        self,
        options: Float8Options,
        collectives_device_type: str | None = None,
        device: torch.device | str | None = None,
    ):
        """`collectives_device_type`: whose collectives the TP plan is chosen for ("cuda" in a dry run on a
        CPU, which simulates them); None: the TP mesh's. `device`: where the matmuls run, which decides
        float8.emulate = "auto" (a dry run on a CPU: "cuda", the device it models); None: CUDA where
        available, else the CPU."""
        self.options = options
        self.collectives_device_type = collectives_device_type
        self.device = device
        self.precompute_scales = options.enable and options.precompute_float8_dynamic_scale_for_fsdp

    def convert(self, model: nn.Module) -> None:
        convert_to_float8(model, self.options, self.device)

    def tp_plan(self, plan: dict, model: nn.Module, tp_mesh: DeviceMesh) -> dict:
        if not self.options.enable:
            return plan
        # For titan-parallel's async TP styles, should the plan get them (the converter is not told).
        offer_async_tp_matmuls(model)
        return float8_tp_plan(plan, model, tp_mesh, self.collectives_device_type)

    def after_optimizer_step(self, parts: list[nn.Module]) -> None:
        if not self.precompute_scales:
            return
        for part in parts:
            # The precompute (one all-reduce for every weight's amax) serves FSDP2's float8 all-gather, so it
            # runs where FSDP2 wraps the part (its root is then an FSDPModule), as the layout decided.
            if isinstance(part, FSDPModule):
                precompute_float8_scales(part)
