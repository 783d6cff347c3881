"""titan_debug's public surface: every name in __all__ is there, and the predictors the dry run and the planner
use (memory and step time) are exported and named in the package's docstring, so a reader finds them there."""

import titan_debug

PREDICTORS = [
    "AllocationTracker",
    "replay",
    "CachingAllocatorModel",
    "OpTrace",
    "predict_step_time",
    "simulate_schedule",
    "DeviceSpec",
    "get_device",
]


def test_every_name_in_all_is_exported():
    assert [name for name in titan_debug.__all__ if not hasattr(titan_debug, name)] == []
    assert len(set(titan_debug.__all__)) == len(titan_debug.__all__)


def test_the_predictors_are_public_and_documented():
    assert [name for name in PREDICTORS if name not in titan_debug.__all__] == []
    assert [name for name in PREDICTORS if name not in titan_debug.__doc__] == []


def test_the_old_module_paths_still_work():
    from titan_debug.step_time import predict

    assert predict is titan_debug.predict_step_time
