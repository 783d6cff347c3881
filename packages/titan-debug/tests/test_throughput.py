import pytest

from titan_debug import Throughput


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_tokens_per_second_and_data_fraction():
    clock = FakeClock()
    throughput = Throughput(clock=clock)
    for _ in range(4):
        with throughput.data_wait():
            clock.now += 0.25  # waiting for the batch
        clock.now += 0.75  # compute
        throughput.add_tokens(2048)
    window = throughput.lap()
    assert window.tokens == 8192
    assert window.seconds == pytest.approx(4.0)
    assert window.tokens_per_second == pytest.approx(2048.0)
    assert window.data_time_frac == pytest.approx(0.25)


def test_lap_starts_a_new_window():
    clock = FakeClock()
    throughput = Throughput(clock=clock)
    throughput.add_tokens(10)
    throughput.add_data_time(1.0)
    clock.now += 2.0
    throughput.lap()
    clock.now += 5.0
    throughput.add_tokens(100)
    window = throughput.lap()
    assert (window.tokens, window.seconds, window.data_seconds) == (100, pytest.approx(5.0), 0.0)
    assert window.tokens_per_second == pytest.approx(20.0)


def test_empty_window_is_zero_not_an_error():
    window = Throughput(clock=FakeClock()).lap()
    assert window.tokens_per_second == 0.0 and window.data_time_frac == 0.0


def test_excluded_time_is_left_out_of_the_window():
    clock = FakeClock()
    throughput = Throughput(clock=clock)
    throughput.add_tokens(1000)
    clock.now += 1.0  # training
    with throughput.excluded():
        clock.now += 9.0  # e.g. an evaluation
    assert throughput.lap().tokens_per_second == 1000.0
