"""LoRA (Hu et al., 2021, arXiv:2106.09685): low-rank adapters trained on a frozen base, as a model conversion
applied before parallelization like float8's, exported in peft's layout (and merged, by the trainer's export),
imported from it. See docs/lora.md."""

from titan_train.lora.adapters import apply_lora, init_adapters, is_adapter_name
from titan_train.lora.converter import LoRAConverter, with_lora
from titan_train.lora.peft_export import adapter_tensors, export_peft_adapter, peft_state_dict
from titan_train.lora.peft_import import load_peft_adapter

__all__ = [
    "LoRAConverter",
    "adapter_tensors",
    "apply_lora",
    "export_peft_adapter",
    "init_adapters",
    "is_adapter_name",
    "load_peft_adapter",
    "peft_state_dict",
    "with_lora",
]
