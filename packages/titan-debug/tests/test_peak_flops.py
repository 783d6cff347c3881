import importlib
import json
import time

import pytest
import torch

from titan_debug import peak_flops
from titan_debug.peak_flops import (
    _GPU_PEAK_FLOPS,
    _cpu_cache_key,
    lookup_gpu_peak_flops,
    probe_cpu_matmul_flops,
)

# The package exports the function `peak_flops`, which shadows the submodule of the same name as an
# attribute; monkeypatching needs the module itself.
pf = importlib.import_module("titan_debug.peak_flops")

T = 1e12


@pytest.mark.parametrize(
    "name, dtype, expected",
    [
        ("NVIDIA H100 80GB HBM3", torch.bfloat16, 989.5 * T),
        ("NVIDIA H100 PCIe", torch.bfloat16, 756 * T),
        ("NVIDIA H100 NVL", torch.bfloat16, 835.5 * T),
        ("NVIDIA H200", torch.bfloat16, 989.5 * T),
        ("NVIDIA A100-SXM4-80GB", torch.bfloat16, 312 * T),
        ("NVIDIA A100 80GB PCIe", torch.float32, 19.5 * T),
        ("NVIDIA A10G", torch.bfloat16, 125 * T),
        ("NVIDIA L4", torch.bfloat16, 121 * T),
        ("NVIDIA L40S", torch.bfloat16, 362.05 * T),
        ("Tesla V100-SXM2-16GB", torch.float16, 125 * T),
        ("Tesla V100-PCIE-32GB", torch.float32, 14 * T),
        ("NVIDIA B200", torch.bfloat16, 2250 * T),
        ("AMD Instinct MI300X", torch.bfloat16, 1307.4 * T),
    ],
)
def test_gpu_table_dense_numbers(name, dtype, expected):
    assert lookup_gpu_peak_flops(name, dtype) == pytest.approx(expected)


@pytest.mark.parametrize(
    "name", ["NVIDIA GeForce GTX 1080", "NVIDIA RTX A1000 Laptop GPU", "Some Future Accelerator", ""]
)
def test_unknown_gpu_is_none(name):
    assert lookup_gpu_peak_flops(name, torch.bfloat16) is None


def test_no_unit_for_dtype_is_none():
    assert lookup_gpu_peak_flops("Tesla V100-SXM2-16GB", torch.bfloat16) is None  # no bf16 tensor cores
    assert lookup_gpu_peak_flops("NVIDIA H100 80GB HBM3", torch.float8_e4m3fn) is None


def test_tf32_selects_tensor_core_peak_for_float32():
    assert lookup_gpu_peak_flops("NVIDIA A100-SXM4-40GB", torch.float32, tf32=True) == pytest.approx(156 * T)
    # No TF32 unit: falls back to plain fp32.
    assert lookup_gpu_peak_flops("AMD Instinct MI300X", torch.float32, tf32=True) == pytest.approx(163.4 * T)


def test_table_is_dense_not_sparse():
    # Sparse datasheet numbers are 2x dense; a sparse H100 entry would be ~1979 TFLOP/s.
    for model, peaks in _GPU_PEAK_FLOPS:
        assert peaks.get("bf16", 0) <= 2500 * T, model
        assert peaks["fp32"] <= peaks.get("bf16", peaks["fp16"]), model


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TITAN_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_cpu_peak_is_measured_then_cached(cache_dir, monkeypatch):
    first = peak_flops(torch.device("cpu"), torch.float32)
    assert first > 1e8  # any CPU manages more than 0.1 GFLOP/s

    cache_file = cache_dir / "peak_flops.json"
    assert json.loads(cache_file.read_text())[_cpu_cache_key(torch.float32)] == first

    def probe_must_not_run(*args, **kwargs):
        raise AssertionError("probe ran although the cache holds the number")

    monkeypatch.setattr(pf, "probe_cpu_matmul_flops", probe_must_not_run)
    assert peak_flops(torch.device("cpu"), torch.float32) == first


def test_cpu_peak_reads_existing_cache_and_keys_by_dtype(cache_dir, monkeypatch):
    (cache_dir / "peak_flops.json").write_text(json.dumps({_cpu_cache_key(torch.float32): 123.0e9}))
    calls = []
    monkeypatch.setattr(pf, "probe_cpu_matmul_flops", lambda dtype: calls.append(dtype) or 7.0e9)

    assert peak_flops(torch.device("cpu"), torch.float32) == 123.0e9
    assert calls == []
    assert peak_flops(torch.device("cpu"), torch.bfloat16) == 7.0e9  # other dtype: own entry, probed
    assert calls == [torch.bfloat16]
    cache = json.loads((cache_dir / "peak_flops.json").read_text())
    assert cache == {_cpu_cache_key(torch.float32): 123.0e9, _cpu_cache_key(torch.bfloat16): 7.0e9}


def test_corrupt_cache_is_replaced(cache_dir, monkeypatch):
    (cache_dir / "peak_flops.json").write_text("{not json")
    monkeypatch.setattr(pf, "probe_cpu_matmul_flops", lambda dtype: 5.0e9)
    assert peak_flops(torch.device("cpu"), torch.float32) == 5.0e9
    assert json.loads((cache_dir / "peak_flops.json").read_text()) == {_cpu_cache_key(torch.float32): 5.0e9}


def test_cache_key_names_cpu_threads_and_dtype():
    key = _cpu_cache_key(torch.bfloat16)
    assert f"threads={torch.get_num_threads()}" in key
    assert key.endswith("|bfloat16")


def test_probe_is_short():
    t0 = time.perf_counter()
    assert probe_cpu_matmul_flops(torch.float32, budget_s=0.2) > 0
    assert time.perf_counter() - t0 < 2.0  # budget 0.2 s; generous for a loaded CI machine


def test_other_device_types_are_unknown():
    assert peak_flops(torch.device("meta"), torch.bfloat16) is None
