"""How DeepSeek-V3 is split: the decoder's plan (titan_models.decoder.plan), with multi-head latent attention's
tensor-parallel entries, the sparse layers split as a whole (experts and shared experts on their hidden units),
and the routed experts named for expert parallelism."""

from titan_models.decoder.plan import decoder_plan as deepseek_v3_plan
from titan_models.decoder.plan import decoder_tp_plan as deepseek_v3_tp_plan

__all__ = ["deepseek_v3_plan", "deepseek_v3_tp_plan"]
