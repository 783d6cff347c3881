"""Named Qwen3-Next sizes: the published shape and small ones for CPU. `hf:<folder>` reads a folder's config.json,
as for Llama 3.

"80B-A3B" is Qwen/Qwen3-Next-80B-A3B-Instruct's config.json on the Hugging Face Hub (the Base and Thinking models
share it; transformers' Qwen3NextConfig defaults repeat most of it): hidden 2048, 48 layers in 12 groups of three
Gated DeltaNet layers then one gated-attention layer (full_attention_interval 4); attention with 16 query and 2
key/value heads of width 256, RoPE on the first quarter of each head (partial_rotary_factor 0.25, rope_theta 1e7,
262144 positions); Gated DeltaNet with 16 query/key heads and 32 value heads of width 128, a 4-tap convolution;
every layer sparse, 512 experts of width 512, 10 per token, renormalised, plus one gated shared expert of width
512; intermediate_size 5120 (no dense layer uses it), vocab 151936, untied embeddings, rms_norm_eps 1e-6. The model
card gives 80B total and 3B active parameters; tests/qwen3_next/test_flavors.py checks count_params against them.
The published folders' MTP layer is not built."""

from __future__ import annotations

from titan_models.decoder.args import DecoderArgs
from titan_models.decoder.flavors import Flavors
from titan_models.linear_attention.args import GatedDeltaNetArgs
from titan_models.moe.args import MoEArgs
from titan_models.qwen3_next.hf_config import args_from_hf_config, layer_types_of, qwen3_next_moe


def _qwen3_next(
    dim: int, layers: int, heads: int, kv_heads: int, head_dim: int, vocab: int, context: int,
    linear: tuple[int, int, int, int], moe: MoEArgs, ffn: int, rope_theta: float = 10_000_000.0,
) -> DecoderArgs:  # fmt: skip
    """Qwen3-Next's decoder: three Gated DeltaNet layers (linear = key heads, value heads, key and value head widths)
    per gated-attention layer, partial RoPE, zero-centred norms, sparse layers with a gated shared expert."""
    key_heads, value_heads, key_dim, value_dim = linear
    return DecoderArgs(
        dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=kv_heads, attention_head_dim=head_dim, vocab_size=vocab,
        ffn_hidden_dim=ffn, norm_eps=1e-6, rope_theta=rope_theta, max_seq_len=context, qk_norm=True,
        attention_output_gate=True, partial_rotary_factor=0.25, zero_centered_norm=True,
        layer_types=layer_types_of({"num_hidden_layers": layers}),
        linear_attention=GatedDeltaNetArgs(dim=dim, n_key_heads=key_heads, n_value_heads=value_heads,
                                           key_head_dim=key_dim, value_head_dim=value_dim, norm_eps=1e-6),
        moe=moe,
    )  # fmt: skip


FLAVORS: dict[str, DecoderArgs] = Flavors(
    {
        # CPU tests: linear, linear, linear, full; 8 experts, 2 per token, a shared expert as wide as one expert.
        "tiny": _qwen3_next(64, 4, 4, 2, 32, 2048, 512, (2, 4, 16, 16), qwen3_next_moe(8, 2, 32, 32), 128, 10000.0),
        # Trains on CPU in about a minute with the repo's test tokenizer vocabulary (2048, as the other debug flavors).
        "debug": _qwen3_next(
            256, 4, 4, 2, 64, 2048, 2048, (4, 8, 32, 32), qwen3_next_moe(8, 2, 128, 128), 512, 10000.0
        ),
        "80B-A3B": _qwen3_next(
            2048, 48, 16, 2, 256, 151936, 262144, (16, 32, 128, 128), qwen3_next_moe(512, 10, 512, 512), 5120
        ),
    },
    read_config=args_from_hf_config,
    family="Qwen3-Next",
)
