"""titan-checkpoint follows the conventions of titan's other commands: --version, --help with examples,
exit codes (0 done, 2 usage mistake, 1 the checkpoint could not be used), one-line errors on stderr."""

import importlib.metadata

import pytest

from titan_checkpoint.cli import main


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"titan-checkpoint {importlib.metadata.version('titan-checkpoint')}"


def test_help_shows_examples_and_exit_codes(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "examples:\n  titan-checkpoint list outputs/checkpoint" in out and "exit codes: 0 done, 2 a usage" in out


def test_usage_mistakes_exit_2_on_stderr(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["exprot", "a", "b"])
    assert exit_.value.code == 2 and "invalid choice: 'exprot'" in capsys.readouterr().err
    assert main(["list", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err == (
        f"titan-checkpoint list: error: {tmp_path / 'missing'} is not a folder; give a checkpoint folder "
        "(holding step-<N> folders)\n"
    )


def test_an_unusable_checkpoint_exits_1(tmp_path, capsys):
    assert main(["verify", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("titan-checkpoint verify: error: ") and "holds no complete checkpoint" in err
