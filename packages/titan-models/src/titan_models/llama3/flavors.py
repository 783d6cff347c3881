"""Named Llama 3 sizes. The large ones are the published Llama 3.1 and 3.2 shapes (Meta's params.json).

Besides the names, `hf:<folder>` is the shape a Hugging Face folder's config.json describes (any Llama 3,
3.1 or 3.2), so `--model.flavor hf:Llama-3.2-1B` fine-tunes a downloaded model with no flavor to match.
"""

from __future__ import annotations

import dataclasses

from titan_models.decoder.args import DecoderArgs
from titan_models.decoder.flavors import Flavors
from titan_models.decoder.rope import RopeScaling
from titan_models.llama3.hf_config import args_from_hf_config

FLAVORS: dict[str, DecoderArgs] = Flavors(
    {
        # Small enough for multi-process CPU tests; n_kv_heads < n_heads so GQA paths are exercised; 4 layers so
        # two pipeline ranks can hold two stages each.
        "tiny": DecoderArgs(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=2048, max_seq_len=512),
        # tiny, deeper and wider in heads: 8 blocks for 4 pipeline ranks of 2 stages, 4 kv heads for TP 4.
        "tiny8": DecoderArgs(dim=64, n_layers=8, n_heads=8, n_kv_heads=4, vocab_size=2048, max_seq_len=512),
        # tiny in the Llama 3.1 style (RoPE scaling) and the 3.2 style (scaling and tied embeddings), scaled to
        # short contexts so the scaling changes frequencies the tests' sequences reach.
        "tiny-3.1": DecoderArgs(
            dim=64,
            n_layers=4,
            n_heads=4,
            n_kv_heads=2,
            vocab_size=2048,
            max_seq_len=512,
            rope_scaling=RopeScaling(factor=4.0, original_max_position_embeddings=128),
        ),
        # TorchTitan's debugmodel: the model the integration tests train.
        "debug": DecoderArgs(dim=256, n_layers=6, n_heads=16, vocab_size=2048, rope_theta=500000),
        # Llama 3.2 1B / 3B: tied embeddings, RoPE scaled 32x from an 8192-token pre-training context.
        "1B": DecoderArgs(
            dim=2048,
            n_layers=16,
            n_heads=32,
            n_kv_heads=8,
            vocab_size=128256,
            ffn_hidden_dim=8192,
            rope_theta=500000,
            rope_scaling=RopeScaling(factor=32.0),
            max_seq_len=131072,
            tie_word_embeddings=True,
        ),
        "3B": DecoderArgs(
            dim=3072,
            n_layers=28,
            n_heads=24,
            n_kv_heads=8,
            vocab_size=128256,
            ffn_hidden_dim=8192,
            rope_theta=500000,
            rope_scaling=RopeScaling(factor=32.0),
            max_seq_len=131072,
            tie_word_embeddings=True,
        ),
        "8B": DecoderArgs(
            dim=4096,
            n_layers=32,
            n_heads=32,
            n_kv_heads=8,
            vocab_size=128256,
            ffn_dim_multiplier=1.3,
            multiple_of=1024,
            rope_theta=500000,
            rope_scaling=RopeScaling(),
            max_seq_len=131072,
        ),
        "70B": DecoderArgs(
            dim=8192,
            n_layers=80,
            n_heads=64,
            n_kv_heads=8,
            vocab_size=128256,
            ffn_dim_multiplier=1.3,
            multiple_of=4096,
            rope_theta=500000,
            rope_scaling=RopeScaling(),
            max_seq_len=131072,
        ),
        "405B": DecoderArgs(
            dim=16384,
            n_layers=126,
            n_heads=128,
            n_kv_heads=8,
            vocab_size=128256,
            ffn_dim_multiplier=1.2,
            multiple_of=4096,
            rope_theta=500000,
            rope_scaling=RopeScaling(),
            max_seq_len=131072,
        ),
    },
    read_config=args_from_hf_config,
    family="Llama 3",
)
FLAVORS["tiny-3.2"] = dataclasses.replace(FLAVORS["tiny-3.1"], tie_word_embeddings=True)
