"""Hyena (Poli et al., "Hyena Hierarchy", 2023): gated long convolutions with implicit filters."""

from titan_models.hyena.args import HyenaArgs
from titan_models.hyena.flavors import FLAVORS
from titan_models.hyena.flops import count_params, flops_per_token
from titan_models.hyena.model import HyenaBlock, HyenaLM, HyenaOperator
from titan_models.hyena.plan import hyena_plan, hyena_tp_plan

__all__ = [
    "FLAVORS",
    "HyenaArgs",
    "HyenaBlock",
    "HyenaLM",
    "HyenaOperator",
    "count_params",
    "flops_per_token",
    "hyena_plan",
    "hyena_tp_plan",
]
