"""How Llama 3 is split: the decoder's plan (titan_models.decoder.plan), which for Llama 3's args (grouped-query
attention, dense SwiGLU) is TorchTitan's Llama plan."""

# sparse_feed_forward_plan and DENSE_FEED_FORWARD were defined here before 0.16; kept until 0.18.
from titan_models.decoder.plan import DENSE_FEED_FORWARD, sparse_feed_forward_plan
from titan_models.decoder.plan import decoder_plan as llama3_plan
from titan_models.decoder.plan import grouped_query_tp_plan as llama3_tp_plan

__all__ = ["DENSE_FEED_FORWARD", "llama3_plan", "llama3_tp_plan", "sparse_feed_forward_plan"]
