"""GPT-OSS through titan-train's config: the one layout its attention (sinks, sliding windows) does not run on
(torch's context parallelism) is refused before anything is built, naming the key; Titan's ring and tensor
parallelism are not."""

import pytest

from titan_train.config import ConfigError, load_config, parse_argv
from titan_train.config.model_args import model_args

GPT_OSS = ["--model.name", "gpt_oss", "--model.flavor", "tiny", "--training.seq_len", "64"]


def args_of(*overrides: str):
    return model_args(load_config(parse_argv([*GPT_OSS, *overrides])))


def test_the_tiny_flavor_has_sinks_and_windows():
    args = args_of()
    assert args.attention_sinks and args.sliding_window is not None


def test_torchs_context_parallelism_is_refused_naming_the_key_titans_is_not():
    cp2 = ("--parallelism.context_parallel_degree", "2")
    with pytest.raises(ConfigError) as error:
        args_of(*cp2, "--parallelism.context_parallel_implementation", "torch")
    message, key = str(error.value), "parallelism.context_parallel_implementation"
    assert f"{key}='torch': model 'gpt_oss' (tiny) has attention sinks, a 8-key window" in message
    assert f"{key} = 'titan'" in message
    assert args_of(*cp2).sliding_window == 8


def test_tensor_parallelism_passes_this_check():
    args = args_of("--parallelism.tensor_parallel_degree", "2")
    assert args.attention_sinks and args.moe.expert_proj_bias


def test_simple_fsdp_beside_tensor_parallelism_is_refused_for_expert_biases():
    refused = r"fsdp_implementation='simple_fsdp' with parallelism.tensor_parallel_degree=2: .* has expert biases"
    with pytest.raises(ConfigError, match=refused):
        args_of("--parallelism.tensor_parallel_degree", "2", "--parallelism.fsdp_implementation", "simple_fsdp")
    args_of("--parallelism.fsdp_implementation", "simple_fsdp")  # without tensor parallelism: nothing to replace


def test_data_expert_and_pipeline_parallelism_pass_this_check():
    # Pipeline stages cannot pool GPT-OSS's auxiliary loss over layers (refused on its own): a per-layer choice.
    args_of("--parallelism.pipeline_parallel_degree", "2", "--parallelism.expert_parallel_degree", "2",
            "--moe.load_balance", "sequence_aux_loss")  # fmt: skip
