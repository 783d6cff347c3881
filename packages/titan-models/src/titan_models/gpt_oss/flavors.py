"""Named GPT-OSS sizes: the published shapes and small ones for CPU. `hf:<folder>` reads a folder's config.json,
as for Llama 3.

The published shapes are openai/gpt-oss-20b's and openai/gpt-oss-120b's config.json on the Hugging Face Hub
(https://huggingface.co/openai/gpt-oss-120b/raw/main/config.json and .../gpt-oss-20b/...), which
transformers' GptOssConfig defaults repeat (transformers 5.23, models/gpt_oss/configuration_gpt_oss.py: the 120b's
36 layers and 128 experts; the 20b differs in num_hidden_layers=24, num_local_experts=32 only): hidden 2880, 64
query heads and 8 key/value heads of width 64, experts of width 2880 (intermediate_size), 4 experts per token,
vocab 201088, a 128-token window on every other layer starting with "sliding_attention", rope_theta 150000 with
YaRN (factor 32, original context 4096, beta_fast 32, beta_slow 1, truncate false) to 131072 positions,
swiglu_limit 7.0, attention_bias true, untied embeddings, rms_norm_eps 1e-5. The model card (OpenAI, "gpt-oss-120b
& gpt-oss-20b Model Card", Aug 2025) gives 20.9B total / 3.6B active and 116.8B total / 5.1B active parameters;
tests/gpt_oss/test_flavors.py checks count_params against those.

One published value is not taken: router_aux_loss_coef 0.9, which transformers applies only with
output_router_logits (false in those configs); the flavors keep MoEArgs' 0.001 for training, and `hf:<folder>`
reads the folder's value."""

from __future__ import annotations

from titan_models.decoder.args import DecoderArgs
from titan_models.decoder.flavors import Flavors
from titan_models.decoder.rope import YarnScaling
from titan_models.gpt_oss.hf_config import args_from_hf_config, gpt_oss_moe

# GPT-OSS's YaRN (rope_parameters of the published configs). mscale_all_dim=0: Hugging Face then scales the rotated
# parts by mscale(factor) = 0.1 ln(32) + 1, as the published configs (which give neither mscale) mean.
PUBLISHED_YARN = YarnScaling(
    factor=32.0, original_max_position_embeddings=4096, beta_fast=32.0, beta_slow=1.0, mscale_all_dim=0.0,
    truncate=False,
)  # fmt: skip


def alternating(n_layers: int) -> list[str]:
    """GPT-OSS's layer_types: sliding, full, sliding, ... (GptOssConfig's default)."""
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layers)]


def _gpt_oss(
    dim: int, layers: int, heads: int, kv_heads: int, head_dim: int, vocab: int, context: int, window: int,
    experts: int, top_k: int, expert_dim: int, rope_scaling: YarnScaling | None = PUBLISHED_YARN,
) -> DecoderArgs:  # fmt: skip
    """GPT-OSS's decoder: biased attention with sinks, alternating windowed and full layers, every layer sparse."""
    return DecoderArgs(
        dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=kv_heads, attention_head_dim=head_dim, vocab_size=vocab,
        ffn_hidden_dim=expert_dim, norm_eps=1e-5, rope_theta=150000.0, rope_scaling=rope_scaling, max_seq_len=context,
        attention_bias=True, attention_sinks=True, sliding_window=window, layer_types=alternating(layers),
        moe=gpt_oss_moe(experts, top_k, expert_dim),
    )  # fmt: skip


FLAVORS: dict[str, DecoderArgs] = Flavors(
    {
        # CPU tests: 4 experts, 2 per token, an 8-token window on layers 0 and 2, grouped-query heads.
        "tiny": _gpt_oss(64, 4, 4, 2, 16, 2048, 512, 8, 4, 2, 64),
        # Trains on CPU in about a minute with the repo's test tokenizer vocabulary (2048, as the other debug flavors).
        "debug": _gpt_oss(256, 4, 8, 2, 32, 2048, 2048, 64, 8, 2, 256),
        "20B": _gpt_oss(2880, 24, 64, 8, 64, 201088, 131072, 128, 32, 4, 2880),
        "120B": _gpt_oss(2880, 36, 64, 8, 64, 201088, 131072, 128, 128, 4, 2880),
    },
    read_config=args_from_hf_config,
    family="GPT-OSS",
)
