"""Parallelism-agnostic model definitions with their plans as data.

Typical use (titan-train does this, with parallelism applied between build and init)::

    spec = get_model_spec("llama3")
    args = spec.args_for("debug")
    with torch.device("meta"):
        model = spec.model_cls(args)
    plan = spec.plan(args)          # what titan-parallel needs
    model.to_empty(device="cpu")
    model.init_weights()
"""

from titan_models import llama3
from titan_models.llama3 import Llama3Args, Llama3HFAdapter, RopeScaling
from titan_models.plan import ModelPlan
from titan_models.registry import ModelSpec, get_model_spec, list_models, register_model

__version__ = "0.1.0"

__all__ = [
    "Llama3Args",
    "Llama3HFAdapter",
    "ModelPlan",
    "ModelSpec",
    "RopeScaling",
    "__version__",
    "get_model_spec",
    "list_models",
    "llama3",
    "register_model",
]
