"""titan-generate --speculative mtp: greedy decoding's text, drafted by the model's MTP modules; the figures on
stderr; clear refusals."""

import dataclasses
import json

import pytest
import torch

from titan_models import get_model_spec
from titan_models.generate import generate
from titan_train.cli.generate import main
from titan_train.data.tokenizer import load_tokenizer

LLAMA = ["--model.name", "llama3", "--model.flavor", "tiny", "--training.seq_len", "64"]
MTP = [*LLAMA, "--model.mtp_layers", "2"]


def trained_elsewhere(mtp_layers: int, name: str = "llama3", seed: int = 11) -> torch.nn.Module:
    """A tiny model with weights the CLI's own init (seed 0) would not give."""
    spec = get_model_spec(name)
    args = spec.args_for("tiny")
    args = dataclasses.replace(args, mtp_layers=mtp_layers) if mtp_layers else args
    with torch.device("meta"):
        model = spec.model_cls(args)
    model.to_empty(device="cpu")
    model.init_weights(seed=seed)
    return model


def greedy_text(model, prompt: str, max_new_tokens: int) -> str:
    tokenizer = load_tokenizer(None)
    ids = generate(model, tokenizer.encode(prompt, eos=False), max_new_tokens, eos_id=tokenizer.eos_id).tolist()
    ids = ids[: ids.index(tokenizer.eos_id) + 1] if tokenizer.eos_id in ids else ids
    return prompt + tokenizer.decode(ids)


def test_one_prompt_prints_greedy_text_and_the_figures(tmp_path, capsys):
    model = trained_elsewhere(mtp_layers=2)
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    argv = [*MTP, "--checkpoint", str(tmp_path / "weights.pt"), "--prompt", "In the beginning",
            "--max-new-tokens", "12", "--speculative", "mtp"]  # fmt: skip
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out.strip() == greedy_text(model, "In the beginning", 12)
    assert "speculative mtp (2 MTP module(s)): acceptance " in err
    assert "tokens per forward" in err and "forwards of the model" in err


@pytest.mark.parametrize("mode", [["--batch-file"], ["--chat", "--prompt"], ["--chat", "--batch-file"]])
def test_stdout_is_that_of_greedy_decoding(tmp_path, capsys, mode):
    """Batch (JSON lines), chat reply, chat batch: the same stdout as without --speculative."""
    model = trained_elsewhere(mtp_layers=2)
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    prompts = ["In the beginning God created", "And", "Let there be light"]
    (tmp_path / "prompts.txt").write_text("\n".join(prompts) + "\n")
    source = str(tmp_path / "prompts.txt") if mode[-1] == "--batch-file" else prompts[0]
    argv = [*MTP, "--checkpoint", str(tmp_path / "weights.pt"), *mode, source, "--max-new-tokens", "10"]
    assert main(argv) == 0
    plain = capsys.readouterr().out
    assert main([*argv, "--speculative", "mtp"]) == 0
    out, err = capsys.readouterr()
    assert out == plain
    assert "speculative mtp (2 MTP module(s)): acceptance" in err
    if mode == ["--batch-file"]:
        lines = [json.loads(line) for line in out.strip().splitlines()]
        assert [line["text"] for line in lines] == [greedy_text(model, prompt, 10) for prompt in prompts]


def test_refusals_name_the_flag_and_the_fix(tmp_path, capsys):
    plain = trained_elsewhere(mtp_layers=0)
    torch.save(plain.state_dict(), tmp_path / "plain.pt")
    checkpoint = ["--checkpoint", str(tmp_path / "plain.pt"), "--prompt", "x"]
    assert main([*LLAMA, *checkpoint, "--speculative", "mtp"]) == 2
    err = capsys.readouterr().err
    assert "--speculative mtp needs a model with multi-token prediction modules" in err
    assert "model.mtp_layers = 0" in err and "model.mtp_layers > 0" in err and "drop --speculative" in err
    assert main([*MTP, *checkpoint, "--speculative", "mtp", "--temperature", "0.8"]) == 2
    assert "--speculative mtp is greedy only, but --temperature=0.8" in capsys.readouterr().err
    assert main([*MTP, *checkpoint, "--speculative", "medusa"]) == 2
    assert "--speculative='medusa' is not allowed; use mtp" in capsys.readouterr().err
    torch.save(trained_elsewhere(0, "hyena").state_dict(), tmp_path / "hyena.pt")
    hyena = ["--model.name", "hyena", "--model.flavor", "tiny", "--training.seq_len", "64"]
    assert main([*hyena, "--checkpoint", str(tmp_path / "hyena.pt"), "--prompt", "x", "--speculative", "mtp"]) == 2
    assert "has none (not a decoder family)" in capsys.readouterr().err
