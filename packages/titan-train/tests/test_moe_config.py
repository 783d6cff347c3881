"""The [moe] section: choices reach the model's args, mistakes are refused naming the key before any work."""

import pytest

from titan_train.cli.train import main
from titan_train.config import ConfigError, load_config, parse_argv
from titan_train.config.model_args import model_args


def args_of(*argv: str):
    return model_args(load_config(parse_argv(list(argv))))


def test_the_flavors_balancing_unless_the_config_chooses():
    flavor = args_of("--model.name", "qwen3_moe", "--model.flavor", "tiny").moe
    assert (flavor.load_balance, flavor.aux_loss_coef, flavor.bias_update_rate) == ("aux_loss", 0.001, 0.001)
    chosen = args_of("--model.name", "qwen3_moe", "--model.flavor", "tiny", "--moe.load_balance", "aux_loss_free",
                     "--moe.bias_update_rate", "0.01", "--moe.aux_loss_coef", "0").moe  # fmt: skip
    assert (chosen.load_balance, chosen.aux_loss_coef, chosen.bias_update_rate) == ("aux_loss_free", 0.0, 0.01)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--moe.load_balance", "aux_loss_free"],
         "moe.load_balance='aux_loss_free' is set but model 'llama3' flavor 'debug' has no mixture-of-experts"),
        (["--model.name", "qwen3_moe", "--model.flavor", "tiny", "--moe.aux_loss_coef", "-2"],
         "moe.aux_loss_coef=-2.0 must be >= 0, or -1 for the flavor's"),
        (["--model.name", "qwen3_moe", "--model.flavor", "tiny", "--parallelism.pipeline_parallel_degree", "2"],
         "model.flavor='tiny' balances with 'aux_loss' (moe.load_balance = 'flavor'), which pools every MoE layer"),
        (["--model.name", "qwen3_moe", "--model.flavor", "tiny", "--moe.load_balance", "aux_los"],
         "did you mean 'aux_loss'"),
    ],
)  # fmt: skip
def test_mistakes_name_the_key_and_the_fix(argv, message):
    with pytest.raises(ConfigError) as error:
        args_of(*argv)
    assert message in str(error.value)


def test_pipeline_with_a_sequence_loss_is_accepted():
    args = args_of("--model.name", "qwen3_moe", "--model.flavor", "tiny", "--parallelism.pipeline_parallel_degree",
                   "2", "--moe.load_balance", "sequence_aux_loss")  # fmt: skip
    assert args.moe.load_balance == "sequence_aux_loss"


def test_the_cli_refuses_before_any_work(capsys):
    assert main(["--moe.load_balance", "none", "--training.steps", "1"]) == 2
    assert "has no mixture-of-experts layers" in capsys.readouterr().err


MOE = ["--model.name", "qwen3_moe", "--model.flavor", "tiny"]  # 8 experts


@pytest.mark.parametrize(
    "argv, world, message",
    [
        (["--parallelism.expert_parallel_degree", "2"], 2,
         "parallelism.expert_parallel_degree=2: model.name='llama3' flavor 'debug' has no routed experts to split"),
        ([*MOE, "--parallelism.expert_parallel_degree", "3"], 3,
         "parallelism.expert_parallel_degree=3 does not divide the 8 experts of model.flavor='tiny'; "
         "use one of [2, 4, 8]"),
        ([*MOE, "--parallelism.expert_parallel_degree", "4"], 2,
         "parallelism.expert_parallel_degree=4 must divide parallelism.data_parallel_shard_degree=2 x "
         "parallelism.context_parallel_degree=1 x parallelism.tensor_parallel_degree=1 = 2"),
        ([*MOE, "--parallelism.expert_parallel_degree", "2", "--parallelism.context_parallel_degree", "4"], 4,
         "a multiple of parallelism.context_parallel_degree x parallelism.tensor_parallel_degree = 4"),
        ([*MOE, "--parallelism.expert_parallel_degree", "2", "--parallelism.tensor_parallel_degree", "2",
          "--parallelism.context_parallel_degree", "2"], 4,
         "a multiple of parallelism.context_parallel_degree x parallelism.tensor_parallel_degree = 4"),
        (["--model.name", "deepseek_v3", "--model.flavor", "tiny", "--parallelism.tensor_parallel_degree", "3"], 3,
         "parallelism.tensor_parallel_degree=3 does not divide n_heads=4 (model.flavor='tiny')"),
        ([*MOE, "--parallelism.expert_parallel_degree", "2", "--parallelism.fsdp_implementation", "simple_fsdp"], 2,
         "use parallelism.fsdp_implementation='fsdp2'"),
    ],
)  # fmt: skip
def test_impossible_expert_parallel_layouts_are_refused_naming_the_keys(argv, world, message):
    from titan_train.config.parallel_layout import resolve_layout

    with pytest.raises(ConfigError) as error:
        resolve_layout(load_config(parse_argv(argv)), world)
    assert message in str(error.value)
    assert "to shard over the rest" not in str(error.value)  # the world-size advice is for world-size mistakes


def test_expert_parallel_layout_takes_its_ranks_from_the_data_ranks():
    from titan_train.config.parallel_layout import resolve_layout

    layout = resolve_layout(load_config(parse_argv([*MOE, "--parallelism.expert_parallel_degree", "2"])), 4)
    assert (layout.dims.ep, layout.dims.edp_shard, layout.dims.dp) == (2, 2, 4)
    # Beside tensor parallelism the tp ranks join the group (ETP = 1): EP 4 on FSDP 2 x TP 2.
    argv = [*MOE, "--parallelism.expert_parallel_degree", "4", "--parallelism.tensor_parallel_degree", "2"]
    layout = resolve_layout(load_config(parse_argv(argv)), 4)
    assert (layout.dims.ep, layout.dims.edp_shard, layout.dims.dp_shard_in_ep, layout.dims.dp) == (4, 1, 2, 2)
