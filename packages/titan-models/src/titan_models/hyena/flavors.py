"""Named Hyena sizes. "125M" is the GPT-2-small shape of the Hyena paper's smallest language model."""

from __future__ import annotations

from titan_models.hyena.args import HyenaArgs

FLAVORS: dict[str, HyenaArgs] = {
    # Small enough for multi-process CPU tests.
    "tiny": HyenaArgs(
        dim=64, n_layers=2, vocab_size=2048, filter_emb_dim=9, filter_order=16, filter_len=512, max_seq_len=512
    ),
    # The Llama debug model's width, for the integration tests and the generation benchmark.
    "debug": HyenaArgs(dim=256, n_layers=4, vocab_size=2048, filter_emb_dim=17, filter_order=32, filter_len=2048),
    # debug with the filters' reach scaled to 64k positions (filter_len sets the decay, see HyenaOperator): at
    # 64k its filters are still long, where debug's fall below 1e-6 of their start past ~10k lags. The generation
    # benchmark's flavor.
    "debug_long": HyenaArgs(dim=256, n_layers=4, vocab_size=2048, filter_emb_dim=17, filter_order=32, filter_len=65536),
    # 12 x 768 with GPT-2's vocabulary padded to a multiple of 64: ~124M parameters without the embedding.
    "125M": HyenaArgs(dim=768, n_layers=12, vocab_size=50304, filter_emb_dim=33, filter_order=64, filter_len=2048),
}
