"""Named Qwen3 sizes: the published shapes (each model's config.json on the Hugging Face Hub) and small ones for
CPU. `hf:<folder>` reads a folder's config.json, as for Llama 3. (Qwen3-MoE's are titan_models.qwen3_moe's.)"""

from __future__ import annotations

from titan_models.decoder.args import DecoderArgs
from titan_models.decoder.flavors import Flavors
from titan_models.qwen3.hf_config import args_from_hf_config

_VOCAB = 151936


def _qwen3(dim: int, n_layers: int, n_heads: int, ffn: int, tied: bool) -> DecoderArgs:
    """A published Qwen3 shape: 8 KV heads, head width 128, RoPE base 1e6, 40960 positions."""
    return DecoderArgs(
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


_TINY = dict(
    dim=64, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=2048, ffn_hidden_dim=128, attention_head_dim=32,
    qk_norm=True, norm_eps=1e-6, rope_theta=1_000_000.0, max_seq_len=512,
)  # fmt: skip
_DEBUG = dict(
    dim=256, n_layers=6, n_heads=8, n_kv_heads=4, vocab_size=2048, ffn_hidden_dim=768, attention_head_dim=64,
    qk_norm=True, norm_eps=1e-6, rope_theta=1_000_000.0, max_seq_len=2048,
)  # fmt: skip

FLAVORS: dict[str, DecoderArgs] = Flavors(
    {
        # head_dim 32 with dim 64 and 4 heads (not 16): the width is independent of dim / n_heads, as in Qwen3.
        "tiny": DecoderArgs(**_TINY, tie_word_embeddings=True),
        "debug": DecoderArgs(**_DEBUG),
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
