"""How Llama 3 is split: the decoder's plan (titan_models.decoder.plan), which for Llama 3's args (grouped-query
attention, dense SwiGLU) is TorchTitan's Llama plan."""

from titan_models.decoder.plan import decoder_plan as llama3_plan
from titan_models.decoder.plan import grouped_query_tp_plan as llama3_tp_plan

__all__ = ["llama3_plan", "llama3_tp_plan"]
