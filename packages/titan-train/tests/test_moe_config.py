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
