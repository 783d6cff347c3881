"""GPT-OSS through titan-train's config: the layouts its attention (sinks, sliding windows) does not run on yet are
refused before anything is built, naming the key."""

import pytest

from titan_train.config import ConfigError, load_config, parse_argv
from titan_train.config.model_args import model_args

GPT_OSS = ["--model.name", "gpt_oss", "--model.flavor", "tiny", "--training.seq_len", "64"]


def args_of(*overrides: str):
    return model_args(load_config(parse_argv([*GPT_OSS, *overrides])))


def test_the_tiny_flavor_has_sinks_and_windows():
    args = args_of()
    assert args.attention_sinks and args.sliding_window is not None


@pytest.mark.parametrize("key", ["tensor_parallel_degree", "context_parallel_degree"])
def test_tensor_and_context_parallelism_are_refused_naming_the_key(key):
    with pytest.raises(ConfigError) as error:
        args_of(f"--parallelism.{key}", "2")
    assert f"parallelism.{key}=2: model 'gpt_oss' (tiny) has attention sinks, a 8-key window" in str(error.value)
    assert f"(parallelism.{key} = 1)" in str(error.value)


def test_data_expert_and_pipeline_parallelism_pass_this_check():
    # Pipeline stages cannot pool GPT-OSS's auxiliary loss over layers (refused on its own): a per-layer choice.
    args_of("--parallelism.pipeline_parallel_degree", "2", "--parallelism.expert_parallel_degree", "2",
            "--moe.load_balance", "sequence_aux_loss")  # fmt: skip
