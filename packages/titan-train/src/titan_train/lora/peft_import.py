"""A peft adapter folder (adapter_config.json + adapter_model.safetensors) read back into our adapters, to
continue training it: the inverse of peft_export's names and Hugging Face's q/k row order. Its config must
describe the adapters [lora] builds, checked before any work (check_peft_adapter)."""

import json
import re
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

from titan_models import get_model_spec
from titan_train.config import ConfigError, JobConfig
from titan_train.config.model_args import model_args
from titan_train.config.sections import Lora
from titan_train.lora.adapters import is_adapter_name, targeted
from titan_train.lora.peft_export import ADAPTER_CONFIG, ADAPTER_WEIGHTS, PEFT_PREFIX

_PEFT_KEY = re.compile(r"(.+)\.(lora_A|lora_B)(?:\.default)?\.weight")
_UNSUPPORTED = {"use_dora": False, "use_rslora": False, "bias": "none"}


def read_peft_config(folder: str) -> dict:
    path = Path(folder).expanduser()
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        if not (path / name).is_file():
            raise ValueError(
                f"lora.initial_adapter_path={folder!r}: no {name} there; give a folder that peft's "
                "save_pretrained (or titan_train.lora.export_peft_adapter) wrote"
            )
    return json.loads((path / ADAPTER_CONFIG).read_text())


def _peft_matches(targets, module: str) -> bool:
    """peft's rule (check_target_module_exists): a string is a regular expression of the whole name; a list
    names modules whole or by a dotted suffix."""
    if isinstance(targets, str):
        return re.fullmatch(targets, module) is not None
    return module in targets or any(module.endswith(f".{target}") for target in targets)


def refuse_mismatched_adapter(config: JobConfig) -> None:
    """ConfigError, before any work, when lora.initial_adapter_path's adapters are not the ones [lora] puts on
    the run's model (built on the meta device)."""
    if not (config.lora.enable and config.lora.initial_adapter_path):
        return
    spec, args = get_model_spec(config.model.name), model_args(config)
    with torch.device("meta"):
        model = spec.model_cls(args)
    try:
        check_peft_adapter(config.lora.initial_adapter_path, config.lora, model, spec.hf_adapter(args))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_peft_adapter(folder: str, options: Lora, model: nn.Module, hf_adapter) -> None:
    """Raise ValueError, naming the key, both values and the fix, when the peft folder's adapters are not the
    ones `options` puts on `model` (the run's model, on the meta device will do): rank, alpha, adapted layers."""
    config = read_peft_config(folder)
    where = f"lora.initial_adapter_path={folder!r}"
    for ours, theirs, value in (("rank", "r", options.rank), ("alpha", "lora_alpha", options.alpha)):
        if config.get(theirs) != value:
            raise ValueError(
                f"{where} has {theirs}={config.get(theirs)} but lora.{ours}={value}; set --lora.{ours} "
                f"{config.get(theirs)} to continue that adapter"
            )
    for key, plain in _UNSUPPORTED.items():
        if config.get(key, plain) != plain:
            raise ValueError(f"{where} has {key}={config[key]!r}; only plain LoRA adapters ({key}={plain!r}) import")
    for key in ("rank_pattern", "alpha_pattern", "layers_to_transform"):  # per-layer ranks, some layers only
        if config.get(key):
            raise ValueError(f"{where} has {key}={config[key]!r}; only adapters of one rank on every layer import")
    linears = [fqn for fqn, module in model.named_modules() if isinstance(module, nn.Linear)]
    hf_names = {fqn: hf_adapter.to_hf_key(f"{fqn}.weight").removesuffix(".weight") for fqn in linears}
    targets = config.get("target_modules")
    if targets == "all-linear":  # peft: every linear layer but the output one
        targets = [hf_names[fqn] for fqn in linears if fqn != "output"]
    theirs = sorted(hf_names[fqn] for fqn in linears if targets and _peft_matches(targets, hf_names[fqn]))
    ours = sorted(hf_names[fqn] for fqn in linears if targeted(fqn, options.target_modules))
    if theirs != ours:
        last = {fqn.rsplit(".", 1)[-1]: name.rsplit(".", 1)[-1] for fqn, name in hf_names.items()}
        raise ValueError(
            f"{where} adapts {len(theirs)} layer(s) ({_last_names(theirs)}) but lora.target_modules="
            f"{options.target_modules} adapts {len(ours)} ({_last_names(ours)}); set lora.target_modules to the "
            f"adapter's layers (ours are named {', '.join(f'{k} for {v}' for k, v in sorted(last.items()))})"
        )


def _last_names(modules: list[str]) -> str:
    return ", ".join(sorted({name.rsplit(".", 1)[-1] for name in modules})) or "none"


def ours_from_peft(tensors: dict[str, torch.Tensor], hf_adapter) -> dict[str, torch.Tensor]:
    """peft's adapter tensors under our names, B's rows back in our q/k order (the inverse of peft_state_dict)."""
    out = {}
    for key, tensor in tensors.items():
        match = _PEFT_KEY.fullmatch(key.removeprefix(PEFT_PREFIX))
        if match is None:
            raise ValueError(f"{key}: not a LoRA A or B weight; only plain LoRA adapters import")
        module, which = match.groups()
        base = hf_adapter.from_hf_key(f"{module}.weight")
        value = hf_adapter.from_hf_tensor(f"{module}.weight", tensor) if which == "lora_B" else tensor
        out[f"{base.removesuffix('.weight')}.{which}.weight"] = value
    return out


@torch.no_grad()
def load_peft_adapter(parts: list[nn.Module], folder: str, hf_adapter) -> None:
    """Copy the adapters of a peft folder into the model parts (any layout: each takes its share of the whole
    tensors). Every adapter of the parts must be in the folder."""
    tensors = ours_from_peft(load_file(str(Path(folder).expanduser() / ADAPTER_WEIGHTS)), hf_adapter)
    for part in parts:
        wanted = [name for name in get_model_state_dict(part) if is_adapter_name(name)]
        missing = [name for name in wanted if name not in tensors]
        if missing:
            raise ValueError(f"lora.initial_adapter_path={folder!r} lacks {len(missing)} adapter(s), e.g. {missing[0]}")
        own = {name: tensors[name] for name in wanted}
        set_model_state_dict(part, own, options=StateDictOptions(full_state_dict=True, strict=False))
