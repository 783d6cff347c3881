import io

from titan_debug.progress import Progress, ProgressLine, format_duration


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_format_duration():
    assert [format_duration(s) for s in (0, 59.6, 61, 3600, 3723)] == ["0:00", "1:00", "1:01", "1:00:00", "1:02:03"]


def test_rate_and_eta_are_measured_from_the_first_update():
    clock = FakeClock()
    progress = Progress(total=10, unit="shard", clock=clock)
    clock.now = 50.0  # set-up time before the first unit is not part of the rate
    progress.update(0)
    assert progress.rate is None and progress.eta_seconds is None and progress.line() == "0/10 0%"
    clock.now = 54.0
    progress.update(2)
    assert progress.rate == 0.5 and progress.eta_seconds == 16.0
    assert progress.line() == "2/10 20% 0.50 shard/s eta 0:16"


def test_progress_line_writes_at_most_once_per_interval_and_always_the_last():
    clock, stream = FakeClock(), io.StringIO()
    with ProgressLine(total=4, label="export", unit="shard", stream=stream, interval=10.0, clock=clock) as line:
        for _ in range(4):
            clock.now += 1.0
            line.advance()
    written = stream.getvalue().splitlines()
    assert written == ["export 1/4 25% 1.00 shard/s eta 0:03", "export 4/4 100% 1.00 shard/s eta 0:00"]
