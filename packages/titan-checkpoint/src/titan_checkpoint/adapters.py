"""Hugging Face adapters by model name, found through the `titan.hf_adapters` entry-point group (titan-models
registers `llama3`, `qwen3`, `qwen3_moe`), so this package never imports a model package.

An adapter is any object with
    to_hf_key(fqn) -> str                    to_hf_tensor(fqn, tensor) -> tensor
    from_hf_key(hf_key) -> str               from_hf_tensor(hf_key, tensor) -> tensor
    hf_config(dtype, bos_token_id=, eos_token_id=) -> dict      (config.json)
and optionally hf_keys() -> list[str] (every tensor a complete HF checkpoint holds), aliases() -> {our FQN: the FQN
whose tensor it shares} (tied embeddings: HF stores the tensor once), stacked_hf_keys(fqn) -> list[str] | None (the
HF tensors, one per slice, that stack on a new first dimension into ours: a mixture of experts' 3-D weights;
to_hf_tensor / from_hf_tensor then convert one slice), args_dict() (its model args as plain data), hf_copies() ->
{HF key: the HF key whose tensor it repeats} (written by an export beside their source: DeepSeek-V3's MTP layer
keeps copies of the embedding and head) and skips_hf_key(hf_key) -> bool (tensors a folder may hold that an import
leaves unread: those copies, a folder's MTP layers past the model's), and fused_hf_keys() -> {HF key: (our FQN, our
FQN)} with merge_to_hf(first, second) -> tensor and split_from_hf(tensor) -> (first, second) (one HF tensor holding
two of ours, which to_hf_key / from_hf_key need not name: GPT-OSS's gate_up_proj interleaves our w1 and w3;
hf_fused.py). The class registered under the entry point also provides from_args_dict(dict) (args stored in a
checkpoint), from_hf_config(dict) (an HF config.json), `architectures` (the config.json architectures it reads) and
optionally from_fingerprint(dict) (an older checkpoint's fingerprint, whose args leave out max_seq_len) and
from_hf_folder(folder) (a folder: its config.json as the weights confirm it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from titan_checkpoint.errors import CheckpointMismatchError

GROUP = "titan.hf_adapters"
# config.json keys that describe the file or how it is trained, not the model: two configs differing only
# here are one model (a run may weigh the auxiliary loss its own way: moe.aux_loss_coef). The multi-token
# prediction layers come after the model: one with none loads a folder's main model (the adapter skips the rest),
# one with them finds them missing by name, and transformers declares 1 in every DeepSeek-V3 folder it saves.
_NOT_SHAPE = ("dtype", "torch_dtype", "max_position_embeddings", "bos_token_id", "eos_token_id", "transformers_version",
              "router_aux_loss_coef", "num_nextn_predict_layers")  # fmt: skip


def _entry_points() -> dict[str, Callable[[], Any]]:
    """name -> loader of the adapter class. Tests replace this function to register toy adapters."""
    return {ep.name: ep.load for ep in entry_points(group=GROUP)}


def find_hf_adapter(name: str) -> Any:
    """The adapter class registered under `name` (e.g. "llama3")."""
    available = _entry_points()
    if name not in available:
        known = ", ".join(sorted(available)) or "none (is titan-models installed?)"
        raise ValueError(f"no Hugging Face adapter named {name!r} in entry-point group {GROUP!r}; available: {known}")
    return available[name]()


def model_description(meta: dict[str, Any]) -> dict[str, Any] | None:
    """What a checkpoint says its model is: titan_meta.json's "model" ({"name", "args" with max_seq_len,
    ...}), or for checkpoints written before it existed the fingerprint ({"name", "flavor", "args"})."""
    return meta.get("model") or meta.get("fingerprint")


def adapter_from_fingerprint(fingerprint: dict[str, Any] | None, model_name: str | None = None) -> Any:
    """The adapter for a checkpoint from its model description (see model_description) or fingerprint."""
    fingerprint = fingerprint or {}
    name = model_name or fingerprint.get("name")
    if name is None:
        raise ValueError("the checkpoint's metadata names no model; pass the model name (--model NAME)")
    if "args" not in fingerprint:
        raise ValueError(
            f"the checkpoint's metadata has no model 'args' to build the {name!r} adapter from; "
            "it was saved without fingerprint={'name': ..., 'args': ...}"
        )
    cls = find_hf_adapter(name)
    if "max_seq_len" not in fingerprint["args"] and hasattr(cls, "from_fingerprint"):
        return cls.from_fingerprint(fingerprint)  # an older checkpoint: its flavor knows the context length
    return cls.from_args_dict(fingerprint["args"])


def adapter_from_meta(meta: dict[str, Any], model_name: str | None = None) -> Any:
    """The adapter for a checkpoint from its titan_meta.json."""
    return adapter_from_fingerprint(model_description(meta), model_name)


def read_hf_config(folder: str | os.PathLike) -> dict[str, Any]:
    file = Path(folder) / "config.json"
    if not file.is_file():
        raise ValueError(f"{folder} has no config.json; a Hugging Face model folder needs one")
    try:
        return json.loads(file.read_text())
    except ValueError as e:
        raise ValueError(f"{file} is not valid JSON ({e})") from e


def adapter_from_hf_folder(folder: str | os.PathLike) -> tuple[str, Any]:
    """(adapter name, adapter) for a Hugging Face folder, from its config.json alone."""
    config = read_hf_config(folder)
    architectures = config.get("architectures") or []
    available = _entry_points()
    for name, load in sorted(available.items()):
        cls = load()
        if set(architectures) & set(getattr(cls, "architectures", ())):
            return name, cls.from_hf_folder(folder) if hasattr(cls, "from_hf_folder") else cls.from_hf_config(config)
    readable = {name: list(getattr(load(), "architectures", ())) for name, load in available.items()}
    raise ValueError(
        f"{folder}/config.json: architectures={architectures} has no Hugging Face adapter; "
        f"the registered adapters read {readable or 'nothing (is titan-models installed?)'}"
    )


def model_differences(ours: Any, theirs: Any) -> list[str]:
    """'key: ours X, theirs Y' for every config.json key (dtype, context length and token ids aside) on
    which two adapters' models differ; empty when they describe the same model, however their args are
    spelled (e.g. an FFN width given directly or through a multiplier)."""
    a, b = ours.hf_config(), theirs.hf_config()
    keys = sorted((set(a) | set(b)) - set(_NOT_SHAPE))
    return [f"{key}: ours {a.get(key)!r}, theirs {b.get(key)!r}" for key in keys if a.get(key) != b.get(key)]


def check_imported_model(checkpoint: Any, saved: dict[str, Any], current: dict[str, Any]) -> None:
    """Refuse a checkpoint with no fingerprint (an import from Hugging Face) whose model description
    differs from this run's model, compared as the config.json each would export (so spelling aside)."""
    if saved.get("name") != current.get("name"):
        raise CheckpointMismatchError(
            f"{checkpoint} holds a {saved.get('name')!r} model; this run builds {current.get('name')!r}"
        )
    try:
        differences = model_differences(adapter_from_fingerprint(current), adapter_from_fingerprint(saved))
    except ValueError:  # no adapter for this model: nothing to compare through
        return
    if differences:
        raise CheckpointMismatchError(
            f"{checkpoint} holds another model than this run's: {'; '.join(differences)} (ours: this run, "
            f"theirs: the checkpoint); choose the matching model.flavor"
        )
