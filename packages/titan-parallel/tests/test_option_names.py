"""option_names: errors name a function's own parameters, or, inside the context, what the caller's users call
them; the names are the caller's data, and leave with the context."""

import pytest

from titan_parallel import ParallelDims, option_names, plan_pipeline

KEYS = {"tp": "parallelism.tensor_parallel_degree", "schedule": "parallelism.pipeline_parallel_schedule"}


def test_errors_name_the_parameter_outside_and_the_callers_key_inside():
    with pytest.raises(ValueError, match=r"^tp=0 must be >= 1"):
        ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=0, pp=1, world_size=1)
    with option_names(KEYS), pytest.raises(ValueError, match=r"^parallelism\.tensor_parallel_degree=0 must be >= 1"):
        ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=0, pp=1, world_size=1)


def test_names_nest_and_are_restored_when_the_context_ends():
    with option_names({"tp": "outer.tp"}):
        with option_names({"schedule": "inner.schedule"}):
            with pytest.raises(ValueError, match=r"^inner\.schedule='1f1x' is unknown"):
                plan_pipeline("1f1x", 2, ["layers.0", "layers.1"], 2)
            with pytest.raises(ValueError, match=r"^outer\.tp=0"):
                ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=0, pp=1, world_size=1)
    with pytest.raises(ValueError, match=r"^schedule='1f1x' is unknown"):
        plan_pipeline("1f1x", 2, ["layers.0", "layers.1"], 2)
