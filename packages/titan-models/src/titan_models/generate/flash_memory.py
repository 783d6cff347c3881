"""Flash generation's memory as the Flash Inference paper counts it, from the model's shape alone (no decoder
built): what `titan-generate --strategy flash` logs, and what HyenaDecoder(strategy="flash").memory() holds
to the byte (tests/generate/test_hyena_step.py)."""

from __future__ import annotations

from titan_models.generate.tile_split import split_sizes, transient_bytes
from titan_models.hyena.args import HyenaArgs


def flash_memory(
    args: HyenaArgs,
    max_len: int,
    batch_size: int,
    prompt_len: int,
    direct_max: int,
    itemsize: int = 4,
    model_itemsize: int = 4,
    split_min: int = 0,
) -> dict[str, int]:
    """Bytes per group (HyenaDecoder.memory's keys) for a flash decoder of `max_len` positions and `batch_size`
    rows after a `prompt_len`-token prompt. itemsize: the filters' float size (4: float32, also for bf16 models,
    whose filters and FFTs run in float32); model_itemsize: the weights' (the short convolutions' caches);
    split_min: the decoder's (tile_split.py: two more kernels of size U / 2 per split tile size U)."""
    channels = args.n_layers * args.n_filters * args.dim
    sizes = [1 << q for q in range(max(max_len - 1, 0).bit_length())]  # tile sizes 1, 2, 4, .. < max_len
    direct = sum(size * size for size in sizes if size <= direct_max)  # values per channel
    fft_bins = sum(size + 1 for size in sizes if size > direct_max)  # complex bins per channel
    for half in split_sizes(max_len, split_min):  # the split tiles' near and far kernels
        direct += 2 * half * half if half <= direct_max else 0
        fft_bins += 2 * (half + 1) if half > direct_max else 0
    history = 2 * channels * batch_size * max_len * itemsize  # inputs and accumulated outputs
    generated = max_len - 1 - prompt_len
    largest = 1 << (generated.bit_length() - 1) if generated >= 1 else 0
    transient = transient_bytes(largest, channels * batch_size, direct_max, split_min, itemsize)
    filters = channels * max_len * itemsize
    spectra = channels * (direct * itemsize + fft_bins * 2 * itemsize)
    short_cache = args.n_layers * batch_size * (args.order + 1) * args.dim * (args.short_filter_len - 1)
    short_cache *= model_itemsize
    small = short_cache + channels * itemsize  # + h[0] + D per channel
    return {
        "history": history,
        "filters": filters,
        "spectra": spectra,
        "scratch": 0,
        "transient": transient,
        "history_per_layer": history // args.n_layers,
        "small": small,
        "state": history + filters + spectra + small,
    }
