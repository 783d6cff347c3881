"""Named Llama 3 sizes. The large ones are the published Llama 3.1 shapes (Meta's params.json)."""

from __future__ import annotations

from titan_models.llama3.args import Llama3Args, RopeScaling

FLAVORS: dict[str, Llama3Args] = {
    # Small enough for multi-process CPU tests; n_kv_heads < n_heads so GQA paths are exercised; 4 layers so
    # two pipeline ranks can hold two stages each.
    "tiny": Llama3Args(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=2048, max_seq_len=512),
    # tiny, deeper and wider in heads: 8 blocks for 4 pipeline ranks of 2 stages, 4 kv heads for TP 4.
    "tiny8": Llama3Args(dim=64, n_layers=8, n_heads=8, n_kv_heads=4, vocab_size=2048, max_seq_len=512),
    # TorchTitan's debugmodel: the model the integration tests train.
    "debug": Llama3Args(dim=256, n_layers=6, n_heads=16, vocab_size=2048, rope_theta=500000),
    "8B": Llama3Args(
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
    "70B": Llama3Args(
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
    "405B": Llama3Args(
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
}
