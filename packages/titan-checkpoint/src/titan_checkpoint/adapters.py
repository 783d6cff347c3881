"""Hugging Face adapters by model name, found through the `titan.hf_adapters` entry-point group (titan-models
registers `llama3`), so this package never imports a model package.

An adapter is any object with
    to_hf_key(fqn) -> str                    to_hf_tensor(fqn, tensor) -> tensor
    from_hf_key(hf_key) -> str               from_hf_tensor(hf_key, tensor) -> tensor
    hf_config(dtype) -> dict                 (config.json)
and optionally hf_keys() -> list[str] (every tensor a complete HF checkpoint holds). The class registered
under the entry point also provides from_args_dict(dict) (args stored in a checkpoint's fingerprint) and
from_hf_config(dict) (an HF config.json).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

GROUP = "titan.hf_adapters"


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


def adapter_from_fingerprint(fingerprint: dict[str, Any] | None, model_name: str | None = None) -> Any:
    """The adapter for a checkpoint from its fingerprint's "name" and "args" (see CheckpointManager)."""
    fingerprint = fingerprint or {}
    name = model_name or fingerprint.get("name")
    if name is None:
        raise ValueError("the checkpoint's fingerprint names no model; pass the model name (--model NAME)")
    if "args" not in fingerprint:
        raise ValueError(
            f"the checkpoint's fingerprint has no model 'args' to build the {name!r} adapter from; "
            "it was saved without fingerprint={'name': ..., 'args': ...}"
        )
    return find_hf_adapter(name).from_args_dict(fingerprint["args"])
