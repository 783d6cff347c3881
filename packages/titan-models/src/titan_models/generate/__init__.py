"""Generation from a trained model: the decoder (Llama 3, Qwen3, ..., GPT-OSS with its sinks, and a rolling cache
of the window on its sliding layers) with a KV cache (Qwen3-Next: a recurrent state of fixed size on its
linear-attention layers, decode_memory), Hyena with exact online long convolutions.

    tokens = generate(model, prompt_ids, max_new_tokens=64, temperature=0.8, top_k=50, seed=0,
                      strategy="flash")     # Hyena: "lazy" | "eager" | "flash"
    rows = generate(model, [prompt_a, prompt_b], max_new_tokens=64)  # any lengths; each row as if alone

    for tokens in generate_tokens(model, prompt, max_new_tokens=64):  # prompt [B, P]; tokens [B] per step
        ...

Greedy decoding drafted by a decoder's multi-token prediction modules (same tokens, fewer main forwards):

    stats = SpeculationStats()
    tokens = generate_speculative(model, prompt_ids, max_new_tokens=64, stats=stats)  # stats.acceptance_rate

Lower level: build_decoder(model, max_len) -> decoder.prefill(tokens) / decoder.step(token) -> logits.
"""

from titan_models.generate.hyena_decode import HyenaDecoder
from titan_models.generate.llama_decode import LlamaDecoder
from titan_models.generate.loop import GenerationOptions, build_decoder, generate, generate_tokens
from titan_models.generate.mtp_draft import MTPDrafter
from titan_models.generate.mtp_speculative import (
    SpeculationStats,
    check_speculative,
    generate_speculative,
    speculative_tokens,
)
from titan_models.generate.online_conv import STRATEGIES, EagerConv, FlashConv, LazyConv, make_online_conv
from titan_models.generate.recurrent_cache import DecodeMemory, decode_memory
from titan_models.generate.sampling import sample_next
from titan_models.generate.tiling import TileKernels, tiles

__all__ = [
    "STRATEGIES",
    "DecodeMemory",
    "EagerConv",
    "FlashConv",
    "GenerationOptions",
    "HyenaDecoder",
    "LazyConv",
    "LlamaDecoder",
    "MTPDrafter",
    "SpeculationStats",
    "TileKernels",
    "build_decoder",
    "check_speculative",
    "decode_memory",
    "generate",
    "generate_speculative",
    "generate_tokens",
    "make_online_conv",
    "sample_next",
    "speculative_tokens",
    "tiles",
]
