"""Qwen3-Next under tensor parallelism: titan-train's config no longer refuses it, and its plan through
titan-parallel on 2 real gloo ranks, alone and under FSDP2, equals one device (qwen3_next_tp_checks.py gives the
tolerances)."""

import sys
from pathlib import Path

import pytest

from forked_ranks import run_ranks
from titan_models.qwen3_next import qwen3_next_plan
from titan_train.config import ConfigError, load_config, parse_argv
from titan_train.config.model_args import model_args
from titan_train.config.parallel_layout import resolve_layout

SCRIPT = Path(__file__).with_name("qwen3_next_tp_checks.py")
CHECKS = ["tensor_parallel", "fsdp2_tensor_parallel"]
QWEN3_NEXT = ["--model.name", "qwen3_next", "--model.flavor", "tiny", "--training.seq_len", "64"]


def test_tensor_parallel_degree_2_resolves_and_the_plan_builds():
    config = load_config(parse_argv([*QWEN3_NEXT, "--parallelism.tensor_parallel_degree", "2"]))
    assert resolve_layout(config, 2).dims.tp == 2
    plan = qwen3_next_plan(model_args(config)).tp_plan(loss_parallel=True)
    assert "layers.0.linear_attn.in_proj_qkvz" in plan and "layers.3.attention.wq" in plan


def test_simple_fsdp_beside_tensor_parallelism_is_refused_naming_the_key():
    tp2 = [*QWEN3_NEXT, "--parallelism.tensor_parallel_degree", "2"]
    refused = r"fsdp_implementation='simple_fsdp' with .*: .* has linear-attention layers.*use parallelism.fsdp_impl"
    with pytest.raises(ConfigError, match=refused):
        model_args(load_config(parse_argv([*tp2, "--parallelism.fsdp_implementation", "simple_fsdp"])))


@pytest.fixture(scope="module")
def two_rank_output() -> str:
    result = run_ranks([sys.executable, str(SCRIPT), *CHECKS], 2, 600)
    return result.stdout + result.stderr


@pytest.mark.parametrize("check", CHECKS)
def test_two_ranks(two_rank_output, check):
    for rank in range(2):
        assert f"rank {rank} {check} ok" in two_rank_output, two_rank_output[-4000:]
