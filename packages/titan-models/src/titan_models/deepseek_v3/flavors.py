"""Named DeepSeek-V3 sizes: the published 671B shape (its config.json on the Hugging Face Hub), the 16B one
TorchTitan trains (DeepSeek-V2-Lite's shape), and small ones for CPU. `hf:<folder>` reads a folder's
config.json, as for Llama 3.

Parameter counts (titan_models.decoder.flops.count_params; "active" = what one token computes with, the
embedding lookup aside, as MFU counts): 671B: 671.03B total, 36.63B active (published: 671B, 37B); 16B:
15.71B total, 2.45B active (DeepSeek-V2-Lite: 15.7B, 2.4B)."""

from __future__ import annotations

from titan_models.decoder.args import DecoderArgs
from titan_models.decoder.flavors import Flavors
from titan_models.decoder.mla_args import MLAArgs
from titan_models.decoder.rope import YarnScaling
from titan_models.deepseek_v3.hf_config import args_from_hf_config
from titan_models.moe.args import MoEArgs

# DeepSeek-V3's routing: sigmoid scores renormalised over the top-k, scaled, auxiliary-loss-free balancing.
_V3_ROUTING = dict(score_func="sigmoid", norm_topk_prob=True, load_balance="aux_loss_free")

FLAVORS: dict[str, DecoderArgs] = Flavors(
    {
        # Every DeepSeek-V3 feature at CPU size: query latent, YaRN, groups, a shared expert, a dense layer 0.
        "tiny": DecoderArgs(
            dim=64,
            n_layers=4,
            n_heads=4,
            vocab_size=2048,
            ffn_hidden_dim=128,
            norm_eps=1e-6,
            max_seq_len=512,
            rope_theta=10000.0,
            rope_scaling=YarnScaling(factor=4.0, original_max_position_embeddings=128),
            mla=MLAArgs(kv_lora_rank=32, q_lora_rank=48, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16),
            moe=MoEArgs(
                num_experts=8,
                top_k=2,
                hidden_dim=32,
                routed_scaling_factor=2.5,
                num_shared_experts=1,
                num_expert_groups=4,
                num_limited_groups=2,
                dense_layers=(0,),
                **_V3_ROUTING,
            ),
        ),
        "debug": DecoderArgs(
            dim=256,
            n_layers=6,
            n_heads=8,
            vocab_size=2048,
            ffn_hidden_dim=768,
            norm_eps=1e-6,
            max_seq_len=2048,
            rope_theta=10000.0,
            rope_scaling=YarnScaling(factor=4.0, original_max_position_embeddings=512),
            mla=MLAArgs(kv_lora_rank=128, q_lora_rank=192, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32),
            moe=MoEArgs(
                num_experts=8,
                top_k=2,
                hidden_dim=256,
                routed_scaling_factor=2.5,
                num_shared_experts=1,
                num_expert_groups=4,
                num_limited_groups=2,
                dense_layers=(0,),
                **_V3_ROUTING,
            ),
        ),
        # TorchTitan's 16B: DeepSeek-V2-Lite's shape and routing (softmax, no renormalisation, no groups).
        "16B": DecoderArgs(
            dim=2048,
            n_layers=27,
            n_heads=16,
            vocab_size=102400,
            ffn_hidden_dim=10944,
            norm_eps=1e-6,
            max_seq_len=163840,
            rope_theta=10000.0,
            rope_scaling=YarnScaling(
                factor=40.0, original_max_position_embeddings=4096, mscale=0.707, mscale_all_dim=0.707
            ),
            mla=MLAArgs(kv_lora_rank=512, q_lora_rank=None, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
            moe=MoEArgs(
                num_experts=64,
                top_k=6,
                hidden_dim=1408,
                score_func="softmax",
                num_shared_experts=2,
                dense_layers=(0,),
                load_balance="aux_loss_free",
            ),
        ),
        "671B": DecoderArgs(
            dim=7168,
            n_layers=61,
            n_heads=128,
            vocab_size=129280,
            ffn_hidden_dim=18432,
            norm_eps=1e-6,
            max_seq_len=163840,
            rope_theta=10000.0,
            rope_scaling=YarnScaling(factor=40.0, original_max_position_embeddings=4096),
            mla=MLAArgs(kv_lora_rank=512, q_lora_rank=1536, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
            moe=MoEArgs(
                num_experts=256,
                top_k=8,
                hidden_dim=2048,
                routed_scaling_factor=2.5,
                num_shared_experts=1,
                num_expert_groups=8,
                num_limited_groups=4,
                dense_layers=(0, 1, 2),
                **_V3_ROUTING,
            ),
        ),
    },  # fmt: skip
    read_config=args_from_hf_config,
    family="DeepSeek-V3",
)
