import pytest
import torch

from titan_parallel import device_module, device_type, distributed_backend


def test_device_type_is_cpu_without_accelerator(monkeypatch):
    monkeypatch.delenv("TITAN_DEVICE", raising=False)
    expected = torch.accelerator.current_accelerator().type if torch.accelerator.is_available() else "cpu"
    assert device_type() == expected


def test_forced_cpu(monkeypatch):
    monkeypatch.setenv("TITAN_DEVICE", "cpu")
    assert device_type() == "cpu"
    assert distributed_backend() == "gloo"
    assert device_module() is torch.cpu


def test_backend_per_device_kind():
    assert distributed_backend("cuda") == "nccl"
    assert distributed_backend("cpu") == "gloo"
    with pytest.raises(ValueError, match="no known torch.distributed backend for device type 'tpu'"):
        distributed_backend("tpu")
