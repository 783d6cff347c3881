"""titan-generate with Qwen3-Next (three Gated DeltaNet layers carrying a recurrent state, then a gated attention
layer with its KV cache): a ragged batch of prompts gives each prompt the text titan_models' generate() gives it
alone, the state's memory per linear layer and the keys and values per token go to stderr; --speculative mtp is
refused with the flag to drop."""

import dataclasses
import json

import torch

from titan_models import get_model_spec
from titan_models.generate import generate
from titan_train.cli.generate import main
from titan_train.data.tokenizer import load_tokenizer

QWEN3_NEXT = ["--model.name", "qwen3_next", "--model.flavor", "tiny", "--training.seq_len", "64"]


def trained_elsewhere(seed: int = 11) -> torch.nn.Module:
    """A tiny Qwen3-Next with weights the CLI's own init (seed 0) would not give."""
    spec = get_model_spec("qwen3_next")
    with torch.device("meta"):
        model = spec.model_cls(dataclasses.replace(spec.args_for("tiny")))
    model.to_empty(device="cpu")
    model.init_weights(seed=seed)
    return model


def test_batch_of_prompts_with_the_state_memory_line(tmp_path, capsys):
    model = trained_elsewhere()
    assert model.args.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    prompts = ["In the beginning God created the heaven and the earth", "And", "Let there be light"]
    (tmp_path / "prompts.txt").write_text("\n".join(prompts) + "\n")
    argv = [*QWEN3_NEXT, "--checkpoint", str(tmp_path / "weights.pt"), "--batch-file", str(tmp_path / "prompts.txt"),
            "--max-new-tokens", "12"]  # fmt: skip
    assert main(argv) == 0
    out, err = capsys.readouterr()
    tokenizer = load_tokenizer(None)
    for line, prompt in zip(out.strip().splitlines(), prompts, strict=True):
        ids = generate(model.eval(), tokenizer.encode(prompt, eos=False), 12, eos_id=tokenizer.eos_id).tolist()
        ids = ids[: ids.index(tokenizer.eos_id) + 1] if tokenizer.eos_id in ids else ids
        assert json.loads(line) == {"prompt": prompt, "text": prompt + tokenizer.decode(ids)}
    # 3 rows x (conv_dim 2*2*16 + 4*16 = 128 x 3 inputs + 4 value heads x 16 x 16 state) x 4 bytes = 16896 B;
    # keys and values: 3 rows x 2 kv heads x 32 x 2 x 4 bytes = 1536 B per token.
    assert (
        "3 linear-attention layer(s) [0, 1, 2] hold a state of 16.5 KiB each, constant in the generated length" in err
    )
    assert "1 attention layer(s) [3] add 1.50 KiB of keys and values each per token" in err
    assert "qwen3_next/tiny" in err


def test_speculative_mtp_is_refused_for_linear_attention(tmp_path, capsys):
    torch.save(trained_elsewhere().state_dict(), tmp_path / "weights.pt")
    argv = [*QWEN3_NEXT, "--checkpoint", str(tmp_path / "weights.pt"), "--prompt", "x", "--speculative", "mtp"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--speculative mtp cannot run on qwen3_next/tiny" in err
    assert "linear-attention layers [0, 1, 2] keep a recurrent state" in err and "drop --speculative" in err
