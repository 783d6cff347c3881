"""Float8 training for Titan models via torchao: convert Linear layers, FSDP2 float8 all-gather, float8 TP.

    converter = Float8Converter(options)             # the three steps below, for build_parallel_model
    report = convert_to_float8(model, options)       # on the meta model, before TP / compile / FSDP
    offer_async_tp_matmuls(model)                    # float8 matmuls for titan-parallel's async TP styles
    apply_tp(model, mesh, float8_tp_plan(plan, model, mesh))
    ...
    optimizer.step(); precompute_float8_scales(model)  # with precompute_float8_dynamic_scale_for_fsdp

torchao is imported only when one of these runs; `require_torchao` says how to install it when it is
missing or too old.
"""

from titan_float8.async_tp import offer_async_tp_matmuls
from titan_float8.convert import Float8Options, Float8Report, convert_to_float8
from titan_float8.converter import Float8Converter
from titan_float8.fsdp import precompute_float8_scales
from titan_float8.matmul_choice import MatmulChoice, choose_float8_matmuls
from titan_float8.requirements import MIN_TORCHAO, require_torchao
from titan_float8.tensor_parallel import float8_tp_plan, float8_tp_styles

__version__ = "0.8.0"

__all__ = [
    "MIN_TORCHAO",
    "Float8Converter",
    "Float8Options",
    "Float8Report",
    "MatmulChoice",
    "choose_float8_matmuls",
    "convert_to_float8",
    "float8_tp_plan",
    "float8_tp_styles",
    "offer_async_tp_matmuls",
    "precompute_float8_scales",
    "require_torchao",
]
