import pytest

from titan_debug import mfu, tflops


def test_mfu_of_known_throughput():
    # 6e9 FLOPs/token (a ~1B-parameter model, 6N) at 1000 tok/s on a 10 TFLOP/s device: 6e12 / 1e13.
    assert mfu(1000.0, 6e9, 1e13) == pytest.approx(0.6)
    assert tflops(1000.0, 6e9) == pytest.approx(6.0)


def test_mfu_unknown_peak_is_none():
    assert mfu(1000.0, 6e9, None) is None


@pytest.mark.parametrize("peak", [0.0, -1.0])
def test_mfu_rejects_non_positive_peak(peak):
    with pytest.raises(ValueError, match="peak"):
        mfu(1000.0, 6e9, peak)


def test_mfu_rejects_negative_throughput():
    with pytest.raises(ValueError, match="tokens_per_second_per_device=-1"):
        mfu(-1.0, 6e9, 1e13)


def test_reported_mfu_is_never_above_100_percent():
    from titan_debug import reported_mfu

    assert reported_mfu(1000.0, 1e6, 1e10) == (0.1, None)
    value, why = reported_mfu(1000.0, 1e6, 1e8)  # 10x the peak: the peak does not bound the step
    assert value is None and why.startswith("1000% against a peak of 0.1 GFLOP/s")
    assert reported_mfu(1000.0, 1e6, None) == (None, "the device's peak FLOP/s is unknown")
