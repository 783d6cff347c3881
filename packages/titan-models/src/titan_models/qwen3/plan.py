"""How Qwen3 is split: the decoder's plan (titan_models.decoder.plan), with the per-head query and key norms
Qwen3's args declare."""

from titan_models.decoder.plan import decoder_plan as qwen3_plan
from titan_models.decoder.plan import decoder_tp_plan as qwen3_tp_plan

__all__ = ["qwen3_plan", "qwen3_tp_plan"]
