"""Hugging Face tensors that hold two of ours (the adapter's optional fused_hf_keys(): GPT-OSS's
mlp.experts.gate_up_proj interleaves our experts' w1 and w3).

Such a tensor has no one-tensor name either way (the adapter's to_hf_key / from_hf_key refuse it): an export reads
both of ours and writes adapter.merge_to_hf(gate, up) under the one key; an import reads the one key and yields both
halves of adapter.split_from_hf(tensor). Each conversion holds the fused tensor and its two halves, no more.
"""

from __future__ import annotations

from typing import Any


def fused_hf_keys(adapter: Any) -> dict[str, tuple[str, str]]:
    """{Hugging Face key: (our first FQN, our second FQN)} of each tensor that holds two of ours; {} for an adapter
    without fused_hf_keys()."""
    return adapter.fused_hf_keys() if hasattr(adapter, "fused_hf_keys") else {}


def fused_key_of(fused: dict[str, tuple[str, str]]) -> dict[str, str]:
    """{our FQN: the Hugging Face key of the tensor it is half of}."""
    return {fqn: hf_key for hf_key, pair in fused.items() for fqn in pair}
