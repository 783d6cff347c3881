"""titan-generate: the recipe's model and tokenizer, weights from a state dict or a DCP checkpoint."""

import pytest
import torch

from titan_models import get_model_spec
from titan_models.generate import generate
from titan_train.generate_cli import main, split_argv
from titan_train.tokenizer import load_tokenizer

MODEL = ["--model.name", "hyena", "--model.flavor", "tiny", "--training.seq_len", "64"]


def trained_elsewhere(seed: int = 11) -> torch.nn.Module:
    """A model with weights the CLI's own init (seed 0) would not give."""
    spec = get_model_spec("hyena")
    with torch.device("meta"):
        model = spec.model_cls(spec.args_for("tiny"))
    model.to_empty(device="cpu")
    model.init_weights(seed=seed)
    return model


def expected_text(model, prompt: str, **kwargs) -> str:
    tokenizer = load_tokenizer(None)
    ids = generate(model, tokenizer.encode(prompt, eos=False), eos_id=tokenizer.eos_id, **kwargs)
    return prompt + tokenizer.decode(ids.tolist())


@pytest.mark.parametrize("strategy", ["flash", "lazy"])
def test_state_dict_file(tmp_path, capsys, strategy):
    model = trained_elsewhere()
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    argv = [*MODEL, "--checkpoint", str(tmp_path / "weights.pt"), "--prompt", "In the beginning",
            "--max-new-tokens", "12", "--strategy", strategy]  # fmt: skip
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == expected_text(model, "In the beginning", max_new_tokens=12)


def test_dcp_checkpoint_folder_with_sampling(tmp_path, capsys):
    from titan_checkpoint import save_seed_checkpoint

    model = trained_elsewhere()
    save_seed_checkpoint(tmp_path / "ckpt", model)
    argv = [*MODEL, "--checkpoint", str(tmp_path / "ckpt"), "--prompt", "And God said", "--max-new-tokens", "8",
            "--temperature", "0.8", "--top-k", "20", "--seed", "5"]  # fmt: skip
    assert main(argv) == 0
    expected = expected_text(model, "And God said", max_new_tokens=8, temperature=0.8, top_k=20, seed=5)
    assert capsys.readouterr().out.strip() == expected


def test_errors_are_one_line(tmp_path, capsys):
    assert main([*MODEL, "--prompt", "x"]) == 2
    assert "--checkpoint is required" in capsys.readouterr().err
    assert main([*MODEL, "--prompt", "x", "--checkpoint", str(tmp_path), "--strategy", "fast"]) == 2
    assert "--strategy='fast' is not allowed; use one of lazy, eager, flash" in capsys.readouterr().err
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert main([*MODEL, "--prompt", "x", "--checkpoint", str(tmp_path)]) == 2
    assert "model 'hyena' has no Hugging Face mapping" in capsys.readouterr().err


def test_split_argv_keeps_recipe_options():
    options, rest = split_argv(["--config", "r.toml", "--max-new-tokens", "5", "--top_k=3", "--training.seq_len", "8"])
    assert (options.max_new_tokens, options.top_k) == (5, 3)
    assert rest == ["--config", "r.toml", "--training.seq_len", "8"]
