import importlib
import json

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


def test_each_variant_finds_its_own_row():
    """Names that share a prefix must not fall into one another's row: the datasheets order the variants
    (PCIe < NVL < SXM for H100; the H200 has the H100 SXM's compute) and give MI300X more than an H100."""
    bf16 = {name: lookup_gpu_peak_flops(name, torch.bfloat16) for name in (
        "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H100 80GB HBM3", "NVIDIA H200", "AMD Instinct MI300X",
        "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe")}  # fmt: skip
    assert bf16["NVIDIA H100 PCIe"] < bf16["NVIDIA H100 NVL"] < bf16["NVIDIA H100 80GB HBM3"]
    assert bf16["NVIDIA H200"] == bf16["NVIDIA H100 80GB HBM3"]
    assert bf16["AMD Instinct MI300X"] > bf16["NVIDIA H100 80GB HBM3"]
    # The A100's PCIe and SXM parts have the same tensor-core peak; both must be found.
    assert bf16["NVIDIA A100-SXM4-80GB"] == bf16["NVIDIA A100 80GB PCIe"] is not None
    # Every name in the table finds the row it is listed under (no earlier row shadows it).
    for model, peaks in _GPU_PEAK_FLOPS:
        dtype = torch.bfloat16 if "bf16" in peaks else torch.float16
        assert lookup_gpu_peak_flops(model, dtype) == peaks.get("bf16", peaks.get("fp16")), model


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
    monkeypatch.setattr(pf, "probe_cpu_matmul_flops", lambda dtype: calls.append(dtype) or 700.0e9)

    assert peak_flops(torch.device("cpu"), torch.float32) == 123.0e9
    assert calls == []
    assert peak_flops(torch.device("cpu"), torch.bfloat16) == 700.0e9  # other dtype: own entry, probed
    assert calls == [torch.bfloat16]
    cache = json.loads((cache_dir / "peak_flops.json").read_text())
    assert cache == {_cpu_cache_key(torch.float32): 123.0e9, _cpu_cache_key(torch.bfloat16): 700.0e9}


def test_cpu_bf16_peak_is_never_below_float32s(cache_dir, monkeypatch):
    """Emulated bf16 (AVX2 only) probes ~40x slower than float32; a mixed-precision step runs part of its work
    at float32 speed, so the bf16 probe alone would put MFU above 100%."""
    (cache_dir / "peak_flops.json").write_text(json.dumps({_cpu_cache_key(torch.float32): 85.0e9}))
    monkeypatch.setattr(pf, "probe_cpu_matmul_flops", lambda dtype: 1.3e9)
    assert peak_flops(torch.device("cpu"), torch.bfloat16) == 85.0e9


def test_corrupt_cache_is_replaced(cache_dir, monkeypatch):
    (cache_dir / "peak_flops.json").write_text("{not json")
    monkeypatch.setattr(pf, "probe_cpu_matmul_flops", lambda dtype: 5.0e9)
    assert peak_flops(torch.device("cpu"), torch.float32) == 5.0e9
    assert json.loads((cache_dir / "peak_flops.json").read_text()) == {_cpu_cache_key(torch.float32): 5.0e9}


def test_cache_key_names_cpu_threads_and_dtype():
    key = _cpu_cache_key(torch.bfloat16)
    assert f"threads={torch.get_num_threads()}" in key
    assert key.endswith("|bfloat16")


@pytest.mark.parametrize(
    "flags, native",
    [({"avx2", "fma"}, False), ({"avx2", "avx512f", "avx512_bf16"}, True), ({"avx2", "amx_bf16"}, True)],
)
def test_cache_key_tells_cpus_with_and_without_native_bf16_apart(monkeypatch, flags, native):
    monkeypatch.setattr(pf, "_cpu_flags", lambda: flags)
    assert pf.cpu_has_native_bf16() is native
    assert ("|bf16=native|" if native else "|bf16=emulated|") in _cpu_cache_key(torch.bfloat16)


def test_probe_measures_a_positive_rate():
    assert probe_cpu_matmul_flops(torch.float32, budget_s=0.2) > 0


def test_other_device_types_are_unknown():
    assert peak_flops(torch.device("meta"), torch.bfloat16) is None
