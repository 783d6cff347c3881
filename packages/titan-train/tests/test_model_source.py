"""titan-generate with the checkpoint alone: the model and tokenizer come from its metadata, no recipe.
(Llama from Hugging Face folders and exports: integration/test_checkpoint_hf.py, test_hf_import.py.)"""

import dataclasses

import pytest
import torch

from titan_checkpoint import save_seed_checkpoint
from titan_models import RopeScaling, get_model_spec
from titan_models.generate import generate
from titan_train.cli.generate import main
from titan_train.data.tokenizer import load_tokenizer


def trained_elsewhere(name: str, flavor: str, seed: int = 11, **changes) -> torch.nn.Module:
    spec = get_model_spec(name)
    with torch.device("meta"):
        model = spec.model_cls(dataclasses.replace(spec.args_for(flavor), **changes))
    model.to_empty(device="cpu")
    model.init_weights(seed=seed)
    return model.eval()


def expected_text(model, prompt: str, **kwargs) -> str:
    tokenizer = load_tokenizer(None)
    ids = generate(model, tokenizer.encode(prompt, eos=False), eos_id=tokenizer.eos_id, **kwargs)
    return prompt + tokenizer.decode(ids.tolist())


def test_model_description_with_changed_args(tmp_path, capsys):
    """Args that differ from every flavor (here: a longer context and RoPE scaling) come from the
    checkpoint's "model" description, nested dataclasses included."""
    model = trained_elsewhere("llama3", "tiny", max_seq_len=1024, rope_scaling=RopeScaling(factor=2.0))
    args = dataclasses.asdict(model.args)
    save_seed_checkpoint(tmp_path / "ckpt", model, model_meta={"name": "llama3", "args": args, "tokenizer": ""})
    assert main(["--checkpoint", str(tmp_path / "ckpt"), "--prompt", "And God said", "--max-new-tokens", "8"]) == 0
    assert capsys.readouterr().out.strip() == expected_text(model, "And God said", max_new_tokens=8)


def test_older_checkpoint_with_a_fingerprint_only(tmp_path, capsys):
    model = trained_elsewhere("hyena", "tiny")
    fingerprint = {"name": "hyena", "flavor": "tiny", "args": dataclasses.asdict(model.args)}
    save_seed_checkpoint(tmp_path / "ckpt", model, fingerprint=fingerprint)
    argv = ["--checkpoint", str(tmp_path / "ckpt"), "--prompt", "In the beginning", "--max-new-tokens", "6"]
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == expected_text(model, "In the beginning", max_new_tokens=6)


@pytest.mark.parametrize("kind", ["no metadata", "not a folder"])
def test_a_checkpoint_that_does_not_say_what_it_holds(tmp_path, capsys, kind):
    model = trained_elsewhere("hyena", "tiny")
    save_seed_checkpoint(tmp_path / "ckpt", model)
    path = tmp_path / "ckpt" if kind == "no metadata" else tmp_path / "nowhere"
    assert main(["--checkpoint", str(path), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert ("does not say which model it holds" if kind == "no metadata" else "is not a folder") in err
    assert "--config RECIPE.toml" in err
