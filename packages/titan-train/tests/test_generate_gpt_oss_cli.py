"""titan-generate with GPT-OSS (attention sinks, an 8-token window on alternate layers, a rolling KV cache there):
a batch of prompts shorter and longer than the window, continued well past it, gives each prompt the text
titan_models' generate() gives it alone; --speculative mtp is refused with the flag to drop."""

import dataclasses
import json

import torch

from titan_models import get_model_spec
from titan_models.generate import generate
from titan_train.cli.generate import main
from titan_train.data.tokenizer import load_tokenizer

GPT_OSS = ["--model.name", "gpt_oss", "--model.flavor", "tiny", "--training.seq_len", "64"]


def trained_elsewhere(mtp_layers: int = 0, seed: int = 11) -> torch.nn.Module:
    """A tiny GPT-OSS with weights the CLI's own init (seed 0) would not give, sinks moved off their init."""
    spec = get_model_spec("gpt_oss")
    args = dataclasses.replace(spec.args_for("tiny"), mtp_layers=mtp_layers)
    with torch.device("meta"):
        model = spec.model_cls(args)
    model.to_empty(device="cpu")
    model.init_weights(seed=seed)
    with torch.no_grad():
        for layer in model.layers.values():
            layer.attention.sinks.normal_(std=1.0, generator=torch.Generator().manual_seed(seed))
    return model


def test_batch_of_prompts_past_the_window(tmp_path, capsys):
    model = trained_elsewhere()
    assert model.args.sliding_window == 8 and model.args.attention_sinks
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    prompts = ["In the beginning God created the heaven and the earth", "And", "Let there be light"]
    (tmp_path / "prompts.txt").write_text("\n".join(prompts) + "\n")
    argv = [*GPT_OSS, "--checkpoint", str(tmp_path / "weights.pt"), "--batch-file", str(tmp_path / "prompts.txt"),
            "--max-new-tokens", "20"]  # fmt: skip
    assert main(argv) == 0
    out, err = capsys.readouterr()
    tokenizer = load_tokenizer(None)
    assert max(len(tokenizer.encode(p, eos=False)) for p in prompts) > 8  # one prompt alone fills the window
    for line, prompt in zip(out.strip().splitlines(), prompts, strict=True):
        ids = generate(model, tokenizer.encode(prompt, eos=False), 20, eos_id=tokenizer.eos_id).tolist()
        ids = ids[: ids.index(tokenizer.eos_id) + 1] if tokenizer.eos_id in ids else ids
        assert json.loads(line) == {"prompt": prompt, "text": prompt + tokenizer.decode(ids)}
    assert "gpt_oss/tiny" in err and "kv cache" in err


def test_speculative_mtp_is_refused_for_sliding_windows(tmp_path, capsys):
    torch.save(trained_elsewhere(mtp_layers=1).state_dict(), tmp_path / "weights.pt")
    argv = [*GPT_OSS, "--model.mtp_layers", "1", "--checkpoint", str(tmp_path / "weights.pt"), "--prompt", "x",
            "--speculative", "mtp"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--speculative mtp cannot run on gpt_oss/tiny" in err
    assert "sliding-window layers [0, 2]" in err and "drop --speculative" in err
