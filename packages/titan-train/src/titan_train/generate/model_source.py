"""A model, its weights and its tokenizer from a checkpoint alone (titan-generate without a recipe).

- A Hugging Face folder (config.json + safetensors): the model from config.json through its adapter, the
  tokenizer from the folder's tokenizer.json (and tokenizer_config.json).
- A DCP checkpoint (a step folder or a folder of steps): the model from its titan_meta.json ("model":
  name and complete args, written by titan-train and `titan-checkpoint import`; for older checkpoints the
  fingerprint and its flavor), the tokenizer it was trained with (recorded there too; "" is the shipped one).
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import torch

from titan_train.config import ConfigError
from titan_train.data.tokenizer import Tokenizer, load_tokenizer


@dataclasses.dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: Tokenizer
    name: str
    """The registry name, e.g. llama3."""
    description: str
    """Where the model came from, for the log line."""


def _replace_fields(base: Any, fields: dict[str, Any]) -> Any:
    """`base` (a dataclass) with `fields` (plain data, as stored) put in; nested dataclasses are rebuilt."""
    hints = typing.get_type_hints(type(base))
    changes = {}
    for f in dataclasses.fields(base):
        if f.name not in fields:
            continue
        value, current = fields[f.name], getattr(base, f.name)
        if isinstance(value, dict):
            if dataclasses.is_dataclass(current):
                value = _replace_fields(current, value)
            else:  # None in the base: the field's dataclass type from its annotation
                kinds = [k for k in typing.get_args(hints[f.name]) if dataclasses.is_dataclass(k)]
                value = kinds[0](**value) if kinds else value
        changes[f.name] = value
    return dataclasses.replace(base, **changes)


def _args_from_description(spec: Any, description: dict[str, Any]) -> Any:
    flavor = description.get("flavor")
    base = spec.args_for(flavor) if flavor in spec.flavors else type(next(iter(spec.flavors.values())))()
    return _replace_fields(base, description.get("args") or {})


def _build(spec: Any, args: Any, device: torch.device, seed: int) -> torch.nn.Module:
    with torch.device("meta"):
        model = spec.model_cls(args)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=device, seed=seed)  # buffers (RoPE, decay rates) are derived
    return model


def _from_hf_folder(folder: Path, device: torch.device, seed: int) -> LoadedModel:
    from titan_checkpoint import adapter_from_hf_folder, load_hf_into_model
    from titan_models import get_model_spec

    try:
        name, adapter = adapter_from_hf_folder(folder)
    except (ValueError, KeyError) as e:
        raise ConfigError(f"--checkpoint {str(folder)!r}: {e}") from None
    if not (folder / "tokenizer.json").is_file():
        raise ConfigError(
            f"--checkpoint {str(folder)!r} has no tokenizer.json; copy the model's tokenizer files into it "
            "(an export with --tokenizer writes them)"
        )
    model = _build(get_model_spec(name), adapter.args, device, seed)
    load_hf_into_model(model, folder, adapter)
    return LoadedModel(model, load_tokenizer(folder), name, f"Hugging Face folder {folder}")


def _from_dcp(path: Path, device: torch.device, seed: int) -> LoadedModel:
    from titan_checkpoint import ModelState, load_checkpoint, model_description, read_meta, resolve_checkpoint
    from titan_models import get_model_spec

    checkpoint = resolve_checkpoint(path)
    description = model_description(read_meta(checkpoint))
    if not description or "name" not in description:
        raise ConfigError(
            f"--checkpoint {str(path)!r}: {checkpoint} does not say which model it holds (no 'model' or "
            "fingerprint in titan_meta.json); give the recipe that trained it: --config RECIPE.toml"
        )
    spec = get_model_spec(description["name"])
    args = _args_from_description(spec, description)
    tokenizer_path = description.get("tokenizer", "")
    if tokenizer_path and not Path(tokenizer_path).is_absolute():
        tokenizer_path = str(checkpoint.parent / tokenizer_path)  # beside the steps (titan-checkpoint import)
    tokenizer = load_tokenizer(tokenizer_path or None)
    if tokenizer.vocab_size > args.vocab_size:
        raise ConfigError(
            f"--checkpoint {str(path)!r}: its tokenizer {tokenizer.path} has {tokenizer.vocab_size} tokens but the "
            f"model's vocab_size is {args.vocab_size}; give the recipe that trained it: --config RECIPE.toml"
        )
    model = _build(spec, args, device, seed)
    load_checkpoint(checkpoint, {"model": ModelState(model)})  # the weights alone, full or model-only save
    flavor = description.get("flavor")
    label = f"{description['name']}/{flavor}" if flavor else description["name"]
    return LoadedModel(model, tokenizer, description["name"], f"{label} from DCP checkpoint {checkpoint}")


def load_from_checkpoint(path: str, device: torch.device, seed: int) -> LoadedModel:
    """The model, weights and tokenizer that `path` (an HF folder or a DCP checkpoint) holds."""
    from titan_checkpoint import is_hf_folder

    p = Path(path).expanduser()
    if not p.is_dir():
        raise FileNotFoundError(
            f"--checkpoint {path!r} is not a folder; without --config give a DCP checkpoint folder or a Hugging "
            "Face folder (a .pt state dict needs the recipe: --config RECIPE.toml)"
        )
    return _from_hf_folder(p, device, seed) if is_hf_folder(p) else _from_dcp(p, device, seed)
