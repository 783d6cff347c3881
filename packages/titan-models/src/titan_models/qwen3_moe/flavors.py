"""Named Qwen3-MoE sizes: the published shapes (each model's config.json on the Hugging Face Hub) and small ones
for CPU. `hf:<folder>` reads a folder's config.json, as for Llama 3."""

from __future__ import annotations

import dataclasses

from titan_models.decoder.args import DecoderArgs
from titan_models.decoder.flavors import Flavors
from titan_models.moe.args import MoEArgs
from titan_models.qwen3_moe.hf_config import args_from_hf_config


def _sparse(
    dim: int, layers: int, heads: int, kv_heads: int, head_dim: int, ffn: int, vocab: int, context: int, moe: MoEArgs
) -> DecoderArgs:
    """Qwen3's attention (per-head q/k norm, RoPE base 1e6) over `layers` blocks whose feed-forward is `moe`."""
    return DecoderArgs(
        dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=kv_heads, attention_head_dim=head_dim, qk_norm=True,
        vocab_size=vocab, ffn_hidden_dim=ffn, norm_eps=1e-6, rope_theta=1_000_000.0, max_seq_len=context, moe=moe,
    )  # fmt: skip


def _experts(num_experts: int, top_k: int, hidden_dim: int, dense_layers: tuple[int, ...] = ()) -> MoEArgs:
    """Qwen3-MoE's routing: softmax scores, the top-k renormalised, no shared experts."""
    return MoEArgs(num_experts, top_k, hidden_dim, norm_topk_prob=True, dense_layers=dense_layers)


FLAVORS: dict[str, DecoderArgs] = Flavors(
    {
        # 8 experts, 2 per token; layer 0 dense (mlp_only_layers) so both block kinds are trained.
        "tiny": _sparse(64, 4, 4, 2, 32, 128, 2048, 512, _experts(8, 2, 32, dense_layers=(0,))),
        "debug": _sparse(256, 6, 8, 4, 64, 768, 2048, 2048, _experts(8, 2, 256, dense_layers=(0,))),
        "30B-A3B": _sparse(2048, 48, 32, 4, 128, 6144, 151936, 40960, _experts(128, 8, 768)),
        "235B-A22B": _sparse(4096, 94, 64, 4, 128, 12288, 151936, 40960, _experts(128, 8, 1536)),
    },
    read_config=args_from_hf_config,
    family="Qwen3-MoE",
)

# Four pipeline-friendly blocks with every kind of feed-forward: dense, and sparse with renormalised top-k.
FLAVORS["tiny-sparse2"] = dataclasses.replace(
    FLAVORS["tiny"], moe=dataclasses.replace(FLAVORS["tiny"].moe, sparse_step=2, dense_layers=())
)
