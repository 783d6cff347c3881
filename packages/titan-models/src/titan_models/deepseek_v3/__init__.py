"""DeepSeek-V3 (DeepSeek-AI, "DeepSeek-V3 Technical Report"): the shared decoder with multi-head latent
attention (titan_models.decoder.mla), YaRN RoPE, and a mixture of experts with sigmoid scores, group-limited routing,
a routed scaling factor, shared experts, dense first layers and auxiliary-loss-free balancing, all declared
as DecoderArgs data."""

from titan_models.deepseek_v3.flavors import FLAVORS
from titan_models.deepseek_v3.hf import DeepseekV3HFAdapter
from titan_models.deepseek_v3.hf_config import args_from_hf_config, hf_config
from titan_models.deepseek_v3.plan import deepseek_v3_plan

__all__ = ["FLAVORS", "DeepseekV3HFAdapter", "args_from_hf_config", "deepseek_v3_plan", "hf_config"]
