"""The merged model, W + B·A·alpha/rank per adapted layer, written by titan-checkpoint's Hugging Face export:
an ordinary model folder that needs no peft to load."""

import torch

from titan_checkpoint import read_model_tensors
from titan_train.lora.adapters import is_adapter_name


def read_adapters(checkpoint, step: int | None = None) -> dict[str, torch.Tensor]:
    """{our name: whole tensor} of the adapters a checkpoint (a step folder, or a folder of steps: the latest,
    or `step`) holds. Reads those tensors only, on the calling process."""
    return read_model_tensors(checkpoint, is_adapter_name, step=step)


def merged_weight(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    """W + B·A·scaling, computed in float32 (the export casts to its dtype afterwards)."""
    return weight.float() + (b.float() @ a.float()) * scaling


class MergedHFAdapter:
    """A model's Hugging Face mapping (`inner`) that exports the merged model: each adapted layer's weight
    with its adapters folded in, the adapters themselves not written. `adapters`: {our name: whole tensor}
    (read_adapters); `scaling`: alpha / rank. Everything else is `inner`'s."""

    def __init__(self, inner, adapters: dict[str, torch.Tensor], scaling: float):
        self.inner, self.scaling = inner, scaling
        layers = {name.rsplit(".", 2)[0] for name in adapters}
        self.merged = {f"{layer}.weight": (adapters[f"{layer}.lora_A.weight"], adapters[f"{layer}.lora_B.weight"])
                       for layer in layers}  # fmt: skip
        self.adapter_names = {name: f"{name.rsplit('.', 2)[0]}.weight" for name in adapters}
        tied = sorted(set(self.merged) & set(self._inner_aliases()))
        if tied:
            raise ValueError(
                f"lora: {tied[0]} is adapted but tied to another weight (tie_word_embeddings): the merged export "
                "cannot store it once; leave that layer out of lora.target_modules"
            )

    def _inner_aliases(self) -> dict[str, str]:
        return self.inner.aliases() if hasattr(self.inner, "aliases") else {}

    def aliases(self) -> dict[str, str]:
        # The exporter skips an alias (a tensor stored as part of another): each adapter is, in its layer's
        # merged weight.
        return {**self._inner_aliases(), **self.adapter_names}

    def to_hf_tensor(self, fqn: str, tensor: torch.Tensor) -> torch.Tensor:
        if fqn in self.merged:
            tensor = merged_weight(tensor, *self.merged[fqn], self.scaling)
        return self.inner.to_hf_tensor(fqn, tensor)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)
