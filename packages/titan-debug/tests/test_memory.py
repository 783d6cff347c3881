import pytest
import torch

from titan_debug import memory_stats, reset_peak_memory_stats

KEYS = {"peak_gib", "peak_active_gib", "peak_reserved_gib", "num_alloc_retries", "num_ooms"}


def test_cpu_memory_stats_keys_and_positive_peak():
    stats = memory_stats(torch.device("cpu"))
    assert set(stats) == KEYS
    assert isinstance(stats["peak_gib"], float) and stats["peak_gib"] > 0
    assert isinstance(stats["num_alloc_retries"], int)


def test_cpu_peak_sees_a_large_allocation():
    x = torch.ones(32 * 1024 * 1024)  # 128 MiB, touched
    assert memory_stats(torch.device("cpu"))["peak_gib"] >= x.numel() * 4 / 1024**3
    reset_peak_memory_stats(torch.device("cpu"))  # no-op on CPU, must not raise
    assert memory_stats(torch.device("cpu"), reset_peak=True)["peak_gib"] >= x.numel() * 4 / 1024**3


@pytest.mark.skipif(torch.accelerator.current_accelerator() is not None, reason="needs a CPU-only machine")
def test_unknown_device_names_the_device():
    with pytest.raises(ValueError, match="meta"):
        memory_stats(torch.device("meta"))
