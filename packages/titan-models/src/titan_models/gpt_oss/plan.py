"""How GPT-OSS is split: the decoder's plan (titan_models.decoder.plan), which takes its entries from the args, so
this family's own tensors are covered where the args declare them:
- the q/k/v/o biases need no entry: torch's ColwiseParallel / RowwiseParallel split or replicate a Linear's bias
  with its weight (wo's added once, after the reduction);
- the sinks (attention.sinks [n_heads], args.attention_sinks) are sharded by head, Shard(0), like wq's output
  rows (ParameterShard, keyed "layers.*.attention.sinks"; Attention reads its local part);
- the sliding windows need nothing: heads are independent and each rank attends over the whole sequence;
- the sparse layers are split as Qwen3-MoE's are (ExpertsHiddenShard): the router bias replicated like the router
  weight, the experts' w1_bias / w3_bias [experts, hidden] split on hidden like w1 / w3, w2_bias [experts, dim]
  replicated and added on one rank only, so once after the reduction; under expert parallelism every expert
  tensor, biases included, is split along experts (titan_parallel.ep) and each rank adds its own experts' biases
  to the rows it receives.
A matrix optimizer (Muon) takes none of the biases (the experts' ones are [experts, hidden], 2-D), the sinks or the
router: the decoder's rule (decoder_adamw_params)."""

from titan_models.decoder.plan import decoder_plan as gpt_oss_plan
from titan_models.decoder.plan import decoder_tp_plan as gpt_oss_tp_plan

__all__ = ["gpt_oss_plan", "gpt_oss_tp_plan"]
