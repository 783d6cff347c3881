"""Named Qwen3 and Qwen3-MoE sizes: the published shapes (each model's config.json on the Hugging Face Hub)
and small ones for CPU. `hf:<folder>` reads a folder's config.json, as for Llama 3."""

from __future__ import annotations

import dataclasses

from titan_models.llama3.args import Llama3Args
from titan_models.llama3.flavors import Flavors
from titan_models.moe.args import MoEArgs
from titan_models.qwen3.hf_config import args_from_hf_config

_VOCAB = 151936


def _qwen3(dim: int, n_layers: int, n_heads: int, ffn: int, tied: bool, **more) -> Llama3Args:
    """A published Qwen3 shape: 8 KV heads (4 with experts), head width 128, RoPE base 1e6, 40960 positions."""
    fields = dict(
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=8,
        vocab_size=_VOCAB,
        ffn_hidden_dim=ffn,
        attention_head_dim=128,
        qk_norm=True,
        norm_eps=1e-6,
        rope_theta=1_000_000.0,
        max_seq_len=40960,
        tie_word_embeddings=tied,
    )
    fields.update(more)
    return Llama3Args(**fields)


_TINY = dict(
    dim=64, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=2048, ffn_hidden_dim=128, attention_head_dim=32,
    qk_norm=True, norm_eps=1e-6, rope_theta=1_000_000.0, max_seq_len=512,
)  # fmt: skip
_DEBUG = dict(
    dim=256, n_layers=6, n_heads=8, n_kv_heads=4, vocab_size=2048, ffn_hidden_dim=768, attention_head_dim=64,
    qk_norm=True, norm_eps=1e-6, rope_theta=1_000_000.0, max_seq_len=2048,
)  # fmt: skip

FLAVORS: dict[str, Llama3Args] = Flavors(
    {
        # head_dim 32 with dim 64 and 4 heads (not 16): the width is independent of dim / n_heads, as in Qwen3.
        "tiny": Llama3Args(**_TINY, tie_word_embeddings=True),
        "debug": Llama3Args(**_DEBUG),
        "0.6B": _qwen3(1024, 28, 16, 3072, tied=True),
        "1.7B": _qwen3(2048, 28, 16, 6144, tied=True),
        "4B": _qwen3(2560, 36, 32, 9728, tied=True),
        "8B": _qwen3(4096, 36, 32, 12288, tied=False),
        "14B": _qwen3(5120, 40, 40, 17408, tied=False),
        "32B": _qwen3(5120, 64, 64, 25600, tied=False),
    },
    read_config=args_from_hf_config,
    family="Qwen3",
)

MOE_FLAVORS: dict[str, Llama3Args] = Flavors(
    {
        # 8 experts, 2 per token; layer 0 dense (mlp_only_layers) so both block kinds are trained.
        "tiny": Llama3Args(
            **_TINY, moe=MoEArgs(num_experts=8, top_k=2, hidden_dim=32, norm_topk_prob=True, dense_layers=(0,))
        ),
        "debug": Llama3Args(
            **_DEBUG, moe=MoEArgs(num_experts=8, top_k=2, hidden_dim=256, norm_topk_prob=True, dense_layers=(0,))
        ),
        "30B-A3B": _qwen3(
            2048,
            48,
            32,
            6144,
            tied=False,
            n_kv_heads=4,
            moe=MoEArgs(num_experts=128, top_k=8, hidden_dim=768, norm_topk_prob=True),
        ),
        "235B-A22B": _qwen3(
            4096,
            94,
            64,
            12288,
            tied=False,
            n_kv_heads=4,
            moe=MoEArgs(num_experts=128, top_k=8, hidden_dim=1536, norm_topk_prob=True),
        ),
    },  # fmt: skip
    read_config=args_from_hf_config,
    family="Qwen3-MoE",
)

# Four pipeline-friendly blocks with every kind of feed-forward: dense, and sparse with renormalised top-k.
MOE_FLAVORS["tiny-sparse2"] = dataclasses.replace(
    MOE_FLAVORS["tiny"], moe=dataclasses.replace(MOE_FLAVORS["tiny"].moe, sparse_step=2, dense_layers=())
)
