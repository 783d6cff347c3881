import subprocess
import sys

import pytest
import torch

from titan_debug import memory_stats

KEYS = {"peak_gib", "peak_active_gib", "peak_reserved_gib", "num_alloc_retries", "num_ooms"}


def test_cpu_memory_stats_keys_and_positive_peak():
    stats = memory_stats(torch.device("cpu"))
    assert set(stats) == KEYS
    assert isinstance(stats["peak_gib"], float) and stats["peak_gib"] > 0
    assert isinstance(stats["num_alloc_retries"], int)


PEAK_AFTER = """
import sys, torch
from titan_debug.memory import memory_stats, reset_peak_memory_stats
x = torch.ones(int(sys.argv[1]))  # touched, so resident
reset_peak_memory_stats(torch.device("cpu"))  # a no-op on CPU; must not raise
print(memory_stats(torch.device("cpu"), reset_peak=True)["peak_gib"])
"""


def _peak_gib_of_a_process_allocating(n_floats: int) -> float:
    out = subprocess.run([sys.executable, "-c", PEAK_AFTER, str(n_floats)], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def test_cpu_peak_sees_a_large_allocation():
    """Two fresh processes, alike but for a 256 MiB tensor: the peak must differ by about its size (the
    process-wide peak RSS of this test process would already be high from earlier tests)."""
    size_gib = 64 * 1024 * 1024 * 4 / 1024**3
    difference = _peak_gib_of_a_process_allocating(64 * 1024 * 1024) - _peak_gib_of_a_process_allocating(1)
    assert 0.9 * size_gib <= difference <= 1.1 * size_gib, difference


def test_unknown_device_names_the_device():
    with pytest.raises(ValueError, match="meta"):
        memory_stats(torch.device("meta"))
