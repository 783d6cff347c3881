"""titan-generate: the recipe's model and tokenizer, weights from a state dict or a DCP checkpoint."""

import pytest
import torch

from titan_models import get_model_spec
from titan_models.generate import generate
from titan_train.cli.generate import main, split_argv
from titan_train.data.tokenizer import load_tokenizer

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


def test_batch_file_gives_each_prompt_its_single_prompt_text(tmp_path, capsys):
    """Prompts of different lengths generated as one batch, sampled: each line equals --prompt on its own."""
    import json

    model = trained_elsewhere()
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    prompts = ["In the beginning God created", "And", "Let there be light"]
    (tmp_path / "prompts.txt").write_text("\n".join(prompts) + "\n")
    argv = [*MODEL, "--checkpoint", str(tmp_path / "weights.pt"), "--batch-file", str(tmp_path / "prompts.txt"),
            "--max-new-tokens", "10", "--temperature", "0.8", "--top-k", "20", "--seed", "5"]  # fmt: skip
    assert main(argv) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [line["prompt"] for line in lines] == prompts
    for line, prompt in zip(lines, prompts, strict=True):
        assert line["text"] == expected_text(model, prompt, max_new_tokens=10, temperature=0.8, top_k=20, seed=5)


def test_batch_file_errors_come_before_any_model_is_built(tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("first\n\nthird\n")
    checkpoint = ["--checkpoint", str(tmp_path / "missing.pt")]  # never read: the errors come first
    assert main([*MODEL, *checkpoint, "--batch-file", str(prompts)]) == 2
    assert f"--batch-file {str(prompts)!r} line 2 is empty; put one prompt on every line" in capsys.readouterr().err
    assert main([*MODEL, *checkpoint, "--batch-file", str(prompts), "--prompt", "x"]) == 2
    assert "--prompt and --batch-file exclude each other" in capsys.readouterr().err
    assert main([*MODEL, *checkpoint, "--batch-file", str(tmp_path / "nothing.txt")]) == 2
    assert "--batch-file" in capsys.readouterr().err
