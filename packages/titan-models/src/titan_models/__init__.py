"""Parallelism-agnostic model definitions with their plans as data.

Typical use (titan-train does this, with parallelism applied between build and init)::

    spec = get_model_spec("llama3")   # or "qwen3", "qwen3_moe", "deepseek_v3", "hyena"
    args = spec.args_for("debug")     # Llama 3, Qwen3, Qwen3-MoE, DeepSeek-V3: one Decoder, DecoderArgs data
    with torch.device("meta"):
        model = spec.model_cls(args)
    plan = spec.plan(args)          # what titan-parallel needs
    model.to_empty(device="cpu")
    model.init_weights()

Generation (the decoder with a KV cache, Hyena with exact online long convolutions)::

    from titan_models.generate import generate
    new_tokens = generate(model, prompt_ids, max_new_tokens=64, temperature=0.8, top_k=50, strategy="flash")
"""

from titan_models import decoder, deepseek_v3, hyena, llama3, moe, qwen3, qwen3_moe
from titan_models.decoder import Decoder, DecoderArgs
from titan_models.hyena import HyenaArgs, HyenaLM
from titan_models.llama3 import Llama3Args, Llama3HFAdapter, RopeScaling, YarnScaling
from titan_models.plan import ModelPlan
from titan_models.registry import ModelSpec, get_model_spec, list_models, register_model

__version__ = "0.23.2"

__all__ = [
    "Decoder",
    "DecoderArgs",
    "HyenaArgs",
    "HyenaLM",
    "Llama3Args",
    "Llama3HFAdapter",
    "ModelPlan",
    "ModelSpec",
    "RopeScaling",
    "YarnScaling",
    "__version__",
    "decoder",
    "deepseek_v3",
    "get_model_spec",
    "hyena",
    "list_models",
    "llama3",
    "moe",
    "qwen3",
    "qwen3_moe",
    "register_model",
]
