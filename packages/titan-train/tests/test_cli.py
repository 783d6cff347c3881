"""The conventions titan-train and titan-generate share: --version, --help with examples, exit codes
(0 done, 2 usage/config mistake, 1 failure) and one-line errors on stderr for mistakes."""

import importlib.metadata
import subprocess
import sys

import pytest

from titan_train.cli import generate as generate_cli
from titan_train.cli import train as cli
from titan_train.cli.command import run_command

VERSION = importlib.metadata.version("titan-train")


@pytest.mark.parametrize(
    "main, prog", [(cli.main, "titan-train"), (generate_cli.main, "titan-generate")], ids=["train", "generate"]
)
def test_version_names_the_command_and_the_installed_version(main, prog, capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"{prog} {VERSION}"


@pytest.mark.parametrize("main", [cli.main, generate_cli.main], ids=["train", "generate"])
def test_help_shows_examples_and_exit_codes(main, capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "exit codes: 0 done, 2 a usage or config mistake" in out


def test_the_console_script_exits_with_the_documented_codes():
    ok = subprocess.run([sys.executable, "-m", "titan_train", "--version"], capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.strip() == f"titan-train {VERSION}"
    typo = subprocess.run(
        [sys.executable, "-m", "titan_train", "--training.stepz", "3"], capture_output=True, text=True
    )
    assert typo.returncode == 2
    assert typo.stderr.strip() == (
        "titan-train: config error: command line: unknown config key 'training.stepz'; did you mean 'training.steps'?"
    )
    assert typo.stdout == ""


def test_a_config_mistake_found_during_the_run_exits_2_without_traceback(monkeypatch, capsys):
    from titan_train.config import ConfigError

    message = "model.flavor='tiny' has vocab_size=256 but the tokenizer has 2000 tokens"

    def train(config, layout):
        raise ConfigError(message)

    monkeypatch.setattr("titan_train.run.trainer.train", train)
    assert cli.main(["--training.steps", "1"]) == 2
    assert capsys.readouterr().err == f"titan-train: config error: {message}\n"


def test_a_known_failure_exits_1_with_its_message_only(monkeypatch, capsys):
    from titan_debug import NonFiniteError

    def train(config, layout):
        raise NonFiniteError("step 3: loss=nan; the run stops before the update (debug.nan_policy='stop')")

    monkeypatch.setattr("titan_train.run.trainer.train", train)
    assert cli.main(["--training.steps", "1"]) == 1
    err = capsys.readouterr().err
    assert err == "titan-train: error: step 3: loss=nan; the run stops before the update (debug.nan_policy='stop')\n"


def test_an_unexpected_failure_exits_1_and_keeps_its_traceback(monkeypatch, capsys):
    def train(config, layout):
        raise RuntimeError("a bug")

    monkeypatch.setattr("titan_train.run.trainer.train", train)
    assert cli.main(["--training.steps", "1"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.endswith("titan-train: error: a bug\n")


def test_interrupt_exits_130(capsys):
    def body():
        raise KeyboardInterrupt

    assert run_command("titan-x", body) == 130
    assert capsys.readouterr().err == "titan-x: interrupted\n"


def test_generate_usage_mistakes_exit_2(capsys):
    assert generate_cli.main(["--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("titan-generate: config error: --checkpoint is required") and "Traceback" not in err


def test_plot_usage_mistakes_exit_2(tmp_path, capsys):
    assert cli.main(["plot"]) == 2
    assert "the following arguments are required: dump_folders" in capsys.readouterr().err
    assert cli.main(["plot", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("titan-train plot: error: ") and "metrics.jsonl does not exist" in err


def test_debug_log_level_prints_the_applied_layout(tmp_path):
    import os

    args = ["--model.flavor", "tiny", "--training.steps", "1", "--training.seq_len", "32",
            "--activation_checkpoint.mode", "full", "--job.dump_folder", str(tmp_path)]  # fmt: skip
    env = {**os.environ, "TITAN_LOG_LEVEL": "DEBUG", "OMP_NUM_THREADS": "1", "TITAN_DEVICE": "cpu"}
    run = subprocess.run([sys.executable, "-m", "titan_train", *args], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "applied layout:\nmodel: blocks layers.0[ac:full], layers.1[ac:full]" in run.stdout
    quiet = subprocess.run([sys.executable, "-m", "titan_train", *args], capture_output=True, text=True,
                           env={**env, "TITAN_LOG_LEVEL": "INFO"})  # fmt: skip
    assert quiet.returncode == 0 and "applied layout" not in quiet.stdout
