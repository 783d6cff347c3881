"""How GPT-OSS is split: the decoder's plan (titan_models.decoder.plan) as it stands, its sparse layers split as
Qwen3-MoE's are and the routed experts named for expert parallelism.

What that plan does not yet say for GPT-OSS's own tensors (titan-parallel's side; decoder/plan.py is not this
family's to change): the q/k/v/o biases need nothing, torch's ColwiseParallel / RowwiseParallel split or replicate a
Linear's bias with its weight; the sinks (attention.sinks [n_heads]) must be sharded by head, Shard(0), like wq's
output rows (Attention reads its local part); the router bias is replicated like the router weight; the experts'
biases w1_bias / w3_bias [experts, hidden] must be split like w1 / w3 on hidden (ExpertsHiddenShard) and along
experts under expert parallelism, w2_bias [experts, dim] along experts only and added once, after the reduction."""

from titan_models.decoder.plan import decoder_plan as gpt_oss_plan
from titan_models.decoder.plan import decoder_tp_plan as gpt_oss_tp_plan

__all__ = ["gpt_oss_plan", "gpt_oss_tp_plan"]
