"""The adapters in peft's layout: a folder that `peft.PeftModel.from_pretrained` loads onto the Hugging Face
export of the base (titan-checkpoint's): adapter_model.safetensors under peft's names, in Hugging Face's tensor
layout, and adapter_config.json."""

import json
import os
import re
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from titan_models.seeded_init import canonical_fqn
from titan_train.config.sections import Lora

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# peft's names: PeftModel.base_model (a LoraModel) .model (the transformers model), adapter name left out.
PEFT_PREFIX = "base_model.model."
_ADAPTER_KEY = re.compile(r"(.+)\.(lora_A|lora_B)\.weight")


def adapter_tensors(parts: list[nn.Module]) -> dict[str, torch.Tensor]:
    """{our name: whole tensor} of the adapters in `parts`. Gathers sharded ones: every rank of the model's mesh
    must call it."""
    tensors = {}
    for part in parts:
        for name, param in part.named_parameters():
            name = canonical_fqn(name)
            if _ADAPTER_KEY.fullmatch(name):
                full = param.full_tensor() if hasattr(param, "full_tensor") else param
                tensors[name] = full.detach().cpu()
    return tensors


def peft_state_dict(state_dict: dict[str, torch.Tensor], hf_adapter) -> dict[str, torch.Tensor]:
    """The adapter entries of `state_dict` (our names, whole tensors; other entries are skipped) under peft's
    names. `hf_adapter`: the model's Hugging Face mapping (titan_models' get_model_spec(name).hf_adapter(args))."""
    out = {}
    for fqn, tensor in state_dict.items():
        match = _ADAPTER_KEY.fullmatch(fqn)
        if match is None:
            continue
        layer, which = match.groups()
        base = f"{layer}.weight"
        # B's rows are the layer's output features, so they take the base weight's row order (the q/k rotary
        # permutation); A's columns are its input features, which no mapping reorders.
        value = hf_adapter.to_hf_tensor(base, tensor) if which == "lora_B" else tensor
        out[f"{PEFT_PREFIX}{hf_adapter.to_hf_key(base).removesuffix('.weight')}.{which}.weight"] = value
    return out


def adapter_config(options: Lora, hf_modules: list[str], base_model: str | None = None) -> dict:
    """peft's LoraConfig as JSON. target_modules lists the adapted modules by whole name, so a pattern that
    adapted some layers only loads onto those."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": options.rank,
        "lora_alpha": options.alpha,
        "lora_dropout": options.dropout,
        "target_modules": hf_modules,
        "bias": "none",
        "fan_in_fan_out": False,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "inference_mode": True,
    }


def export_peft_adapter(
    state_dict: dict[str, torch.Tensor],
    out: str | os.PathLike,
    hf_adapter,
    options: Lora,
    *,
    base_model: str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Path:
    """Write the adapters of `state_dict` (see peft_state_dict) to the folder `out`; returns it."""
    tensors = {k: v.to(dtype).contiguous() for k, v in peft_state_dict(state_dict, hf_adapter).items()}
    if not tensors:
        raise ValueError("no LoRA adapter in the state dict (names like 'layers.0.attention.wq.lora_A.weight')")
    modules = sorted({k.removeprefix(PEFT_PREFIX).rsplit(".", 2)[0] for k in tensors})
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / ADAPTER_WEIGHTS, metadata={"format": "pt"})
    (out / ADAPTER_CONFIG).write_text(json.dumps(adapter_config(options, modules, base_model), indent=2) + "\n")
    return out
