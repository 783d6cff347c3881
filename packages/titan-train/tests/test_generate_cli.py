"""titan-generate: the recipe's model and tokenizer, weights from a state dict or a DCP checkpoint."""

import json
from pathlib import Path

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
    captured = capsys.readouterr()
    assert captured.out.strip() == expected_text(model, "In the beginning", max_new_tokens=12)
    assert ("no tile split" in captured.err) == (strategy == "flash")  # 16 positions: no tile worth splitting


def test_flash_line_names_the_tile_split():
    """The decoder's default split (titan_models.generate.tile_split): tiny's largest tile of 512 outweighs a token,
    and at 8 rows its halves are large enough."""
    from titan_train.cli.generate import flash_memory_line

    line = flash_memory_line(trained_elsewhere(), [[1, 2, 3]] * 8, 600)
    assert line.endswith("; tiles >= 512 split over the steps around them")
    assert flash_memory_line(trained_elsewhere(), [[1, 2, 3]], 600).endswith("; no tile split")  # 1 row: too small


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
    flags = (["--chat"], ["--chat", "true"], ["--chat=false"])
    assert [split_argv(argv)[0].chat for argv in flags] == [True, True, False]
    assert split_argv(["--chat", "--prompt", "hi"])[0].prompt == "hi"


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


CHAT = "Who built the ark?"


def chat_ids(prompt: str, system: str = "") -> list[int]:
    """The embedded tokenizer's template (titan_train/assets/chat_template.jinja) with the generation prompt."""
    from titan_train.data.chat_template import load_chat_template

    tokenizer = load_tokenizer(None)
    messages = [{"role": "system", "content": system}] if system else []
    text, _ = load_chat_template(Path(tokenizer.path).parent).render(
        [*messages, {"role": "user", "content": prompt}], add_generation_prompt=True
    )
    return tokenizer.encoding(text).ids


def test_chat_feeds_the_rendered_template_and_stops_at_the_end_of_turn(tmp_path, capsys, monkeypatch):
    """--chat --system: the model is fed the template's rendering with the generation prompt; its greedy reply
    stops before the end-of-turn token that generation_config.json (beside the checkpoint) names, and only
    the reply is printed."""
    import titan_train.cli.generate as cli
    from titan_checkpoint import save_seed_checkpoint

    model = trained_elsewhere()
    save_seed_checkpoint(tmp_path / "ckpt", model)
    system = "Answer from the King James Bible."
    ids = chat_ids(CHAT, system)
    assert ids[0] == load_tokenizer(None).bos_id and ids[-1] != load_tokenizer(None).eos_id
    free = generate(model, ids, 12).tolist()  # unstopped greedy: its 4th token (new so far) becomes the end of turn
    stop = next(t for i, t in enumerate(free) if i >= 3 and t not in free[:i])
    (tmp_path / "ckpt" / "generation_config.json").write_text(json.dumps({"eos_token_id": [stop]}))
    fed = []
    real_stream = cli.stream_tokens
    monkeypatch.setattr(cli, "stream_tokens", lambda m, prompt, *a, **k: fed.append(list(prompt)) or real_stream(
        m, prompt, *a, **k))  # fmt: skip
    argv = [*MODEL, "--checkpoint", str(tmp_path / "ckpt"), "--chat", "--system", system, "--prompt", CHAT,
            "--max-new-tokens", "12"]  # fmt: skip
    assert main(argv) == 0
    assert fed == [ids]
    out, err = capsys.readouterr()
    assert out == load_tokenizer(None).decode(free[: free.index(stop)]) + "\n"
    assert f"{free.index(stop)} tokens for 1 prompt(s)" in err


def test_chat_batch_file_gives_each_prompt_its_reply(tmp_path, capsys):
    model = trained_elsewhere()
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    prompts = [CHAT, "How many days did it rain?"]
    (tmp_path / "prompts.txt").write_text("\n".join(prompts) + "\n")
    argv = [*MODEL, "--checkpoint", str(tmp_path / "weights.pt"), "--chat", "--batch-file",
            str(tmp_path / "prompts.txt"), "--max-new-tokens", "8", "--temperature", "0.8", "--seed", "5"]  # fmt: skip
    assert main(argv) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    tokenizer = load_tokenizer(None)
    for line, prompt in zip(lines, prompts, strict=True):
        new = generate(model, chat_ids(prompt), 8, temperature=0.8, seed=5).tolist()
        reply = new[: new.index(tokenizer.eos_id)] if tokenizer.eos_id in new else new
        assert line == {"prompt": prompt, "text": tokenizer.decode(reply)}


def test_chat_without_a_template_names_the_folder_and_the_fix(tmp_path, capsys):
    import shutil

    model = trained_elsewhere()
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    folder = tmp_path / "tok"
    folder.mkdir()
    shutil.copy(load_tokenizer(None).path, folder / "tokenizer.json")
    argv = [*MODEL, "--model.tokenizer_path", str(folder), "--checkpoint", str(tmp_path / "weights.pt"), "--chat",
            "--prompt", CHAT]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--chat: the model folder {str(folder)!r}" in err and "has no chat template" in err
    assert "chat_template.jinja" in err
    assert main([*MODEL, "--checkpoint", str(tmp_path / "weights.pt"), "--system", "x", "--prompt", CHAT]) == 2
    assert "--system is the system message of a --chat prompt; add --chat" in capsys.readouterr().err
    assert main([*MODEL, "--checkpoint", "x.pt", "--chat=maybe", "--prompt", CHAT]) == 2
    assert "--chat='maybe' must be true or false" in capsys.readouterr().err
