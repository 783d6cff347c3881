"""How Qwen3-MoE is split: the decoder's plan (titan_models.decoder.plan), with Qwen3's per-head query and key
norms and the sparse layers' feed-forward split as a whole (ExpertsHiddenShard), their experts named for expert
parallelism."""

from titan_models.decoder.plan import decoder_plan as qwen3_moe_plan
from titan_models.decoder.plan import decoder_tp_plan as qwen3_moe_tp_plan

__all__ = ["qwen3_moe_plan", "qwen3_moe_tp_plan"]
