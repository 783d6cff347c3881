"""Models by name: what titan-train looks up from `[model] name` and `flavor`."""

from __future__ import annotations

import copy
import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from titan_models.plan import ModelPlan


def _did_you_mean(word: str, choices: list[str]) -> str:
    # Compared case-insensitively: "8b" should find "8B".
    by_lower = {choice.lower(): choice for choice in choices}
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=1)
    return f"did you mean {by_lower[close[0]]!r}? " if close else ""


@dataclass
class ModelSpec:
    name: str
    """Registry key, the value of `[model] name`."""
    flavors: dict[str, Any]
    """Named argument sets (e.g. "debug", "8B"), the values of `[model] flavor`."""
    model_cls: Callable[[Any], nn.Module]
    """Builds the model from one flavor's args; call it under torch.device("meta")."""
    plan: Callable[[Any], ModelPlan]
    """args -> how to parallelize the model."""
    flops_per_token: Callable[[Any, int], int]
    """(args, seq_len) -> training FLOPs per token, for MFU."""
    hf_adapter: Callable[[Any], Any]
    """args -> ours <-> Hugging Face name and tensor mapping."""
    decoding: str = "kv cache"
    """How generation decodes one token after another: "kv cache" (attention keys and values kept), or
    "long convolution" (the online convolution strategies of titan_models.generate.STRATEGIES)."""

    def args_for(self, flavor: str) -> Any:
        """A copy of the flavor's args, safe to modify (e.g. max_seq_len from the training config)."""
        if flavor not in self.flavors:
            valid = ", ".join(self.flavors)
            raise ValueError(
                f"model.flavor={flavor!r} is not a flavor of {self.name}; "
                f"{_did_you_mean(flavor, list(self.flavors))}valid flavors: {valid}"
            )
        return copy.deepcopy(self.flavors[flavor])


_REGISTRY: dict[str, ModelSpec] = {}


def register_model(spec: ModelSpec) -> None:
    if spec.name in _REGISTRY:
        raise ValueError(f"model {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec


def list_models() -> list[str]:
    return sorted(_REGISTRY)


def get_model_spec(name: str) -> ModelSpec:
    if name not in _REGISTRY:
        raise ValueError(
            f"model.name={name!r} is not a registered model; "
            f"{_did_you_mean(name, list_models())}valid names: {', '.join(list_models())}"
        )
    return _REGISTRY[name]


def _register_builtin_models() -> None:
    from titan_models.decoder import Decoder, flops_per_token
    from titan_models.deepseek_v3 import FLAVORS as DEEPSEEK_V3_FLAVORS
    from titan_models.deepseek_v3 import DeepseekV3HFAdapter, deepseek_v3_plan
    from titan_models.gpt_oss import FLAVORS as GPT_OSS_FLAVORS
    from titan_models.gpt_oss import GptOssHFAdapter, gpt_oss_plan
    from titan_models.hyena import FLAVORS as HYENA_FLAVORS
    from titan_models.hyena import HyenaLM, hyena_plan
    from titan_models.hyena import flops_per_token as hyena_flops_per_token
    from titan_models.llama3 import FLAVORS as LLAMA3_FLAVORS
    from titan_models.llama3 import Llama3HFAdapter, llama3_plan
    from titan_models.qwen3 import FLAVORS as QWEN3_FLAVORS
    from titan_models.qwen3 import Qwen3HFAdapter, qwen3_plan
    from titan_models.qwen3_moe import FLAVORS as QWEN3_MOE_FLAVORS
    from titan_models.qwen3_moe import Qwen3MoeHFAdapter, qwen3_moe_plan
    from titan_models.qwen3_next import FLAVORS as QWEN3_NEXT_FLAVORS
    from titan_models.qwen3_next import Qwen3NextHFAdapter, qwen3_next_plan

    # One decoder for every family built on it: the flavors' args carry the differences (q/k norm, MLA, experts,
    # sinks and windows, linear-attention layers).
    for name, flavors, plan, adapter in (
        ("llama3", LLAMA3_FLAVORS, llama3_plan, Llama3HFAdapter),
        ("qwen3", QWEN3_FLAVORS, qwen3_plan, Qwen3HFAdapter),
        ("qwen3_moe", QWEN3_MOE_FLAVORS, qwen3_moe_plan, Qwen3MoeHFAdapter),
        ("deepseek_v3", DEEPSEEK_V3_FLAVORS, deepseek_v3_plan, DeepseekV3HFAdapter),
        ("gpt_oss", GPT_OSS_FLAVORS, gpt_oss_plan, GptOssHFAdapter),
        ("qwen3_next", QWEN3_NEXT_FLAVORS, qwen3_next_plan, Qwen3NextHFAdapter),
    ):
        register_model(
            ModelSpec(
                name=name,
                flavors=flavors,
                model_cls=Decoder,
                plan=plan,
                flops_per_token=flops_per_token,
                hf_adapter=adapter,
            )
        )
    register_model(
        ModelSpec(
            name="hyena",
            flavors=HYENA_FLAVORS,
            model_cls=HyenaLM,
            plan=hyena_plan,
            flops_per_token=hyena_flops_per_token,
            hf_adapter=_no_hf_adapter("hyena"),
            decoding="long convolution",
        )
    )


def _no_hf_adapter(name: str) -> Callable[[Any], Any]:
    def hf_adapter(args: Any) -> Any:
        raise NotImplementedError(
            f"model {name!r} has no Hugging Face mapping (Transformers has no matching architecture); "
            "save and load it as a DCP checkpoint instead"
        )

    return hf_adapter


_register_builtin_models()
