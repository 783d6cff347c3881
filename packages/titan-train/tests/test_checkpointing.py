"""Checkpointing through the trainer on one process: exact resume, NaN safety, seed checkpoints, export."""

import json

import pytest
import torch

from titan_checkpoint import complete_steps
from titan_debug import NonFiniteError
from titan_train.config import ConfigError, load_config, parse_argv
from titan_train.run.distributed import init_distributed
from titan_train.run.trainer import Trainer, train

BASE = [
    "--model.flavor",
    "tiny",
    "--training.seq_len",
    "32",
    "--training.local_batch_size",
    "2",
    "--training.deterministic",
    "true",
    "--metrics.log_freq",
    "1000",
    "--lr_scheduler.warmup_steps",
    "2",
]


def config(tmp_path, *overrides):
    return load_config(parse_argv(["--job.dump_folder", str(tmp_path), *BASE, *overrides]))


def trainer(tmp_path, *overrides) -> Trainer:
    cfg = config(tmp_path, *overrides)
    return Trainer(cfg, init_distributed(cfg))


def test_resume_gives_bit_identical_losses(tmp_path):
    straight = trainer(tmp_path / "a", "--training.steps", "8").train()
    ckpt = ["--checkpoint.enable", "true", "--checkpoint.interval", "4", "--training.steps", "8"]
    first = trainer(tmp_path / "b", *ckpt)
    first.config.training.steps = 4  # a run cut off after step 4 (its schedule still spans 8 steps)
    part1 = first.train()
    assert complete_steps(tmp_path / "b" / "checkpoint") == [4]
    resumed = trainer(tmp_path / "b", *ckpt)
    assert resumed.step_count == 4
    part2 = resumed.train()
    assert part1 + part2 == straight
    assert complete_steps(tmp_path / "b" / "checkpoint") == [4, 8]


def test_nan_stops_without_a_checkpoint_after_it(tmp_path):
    t = trainer(tmp_path, "--checkpoint.enable", "true", "--checkpoint.interval", "1", "--training.steps", "6")
    calls = {"n": 0}

    def nan_on_step_4(module, args, output):
        calls["n"] += 1
        return output * float("nan") if calls["n"] == 4 else output

    t.model.output.register_forward_hook(nan_on_step_4)
    with pytest.raises(NonFiniteError, match="step 4"):
        t.train()
    assert complete_steps(tmp_path / "checkpoint") == [1, 2, 3]


def test_seed_checkpoint_is_where_every_run_starts(tmp_path):
    cfg = config(tmp_path, "--checkpoint.enable", "true", "--checkpoint.create_seed_checkpoint", "true")
    assert train(cfg) == []
    assert complete_steps(tmp_path / "checkpoint") == [0]
    with pytest.raises(ConfigError, match="already holds checkpoints"):
        train(cfg)
    # A different init seed is overridden by the seed checkpoint's weights.
    from_seed = trainer(tmp_path, "--checkpoint.enable", "true", "--training.seed", "7", "--training.steps", "1")
    fresh = trainer(tmp_path / "fresh", "--training.steps", "1")
    for (name, a), b in zip(from_seed.model.state_dict().items(), fresh.model.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_different_model_checkpoint_is_refused(tmp_path):
    trainer(tmp_path, "--checkpoint.enable", "true", "--training.steps", "1").train()
    with pytest.raises(Exception, match="flavor"):
        trainer(tmp_path, "--checkpoint.enable", "true", "--training.steps", "2", "--model.flavor", "debug")


def test_export_at_the_end_writes_hf_layout(tmp_path):
    trainer(tmp_path, "--checkpoint.enable", "true", "--training.steps", "2",
            "--checkpoint.export_safetensors", "true", "--checkpoint.export_dtype", "bfloat16").train()  # fmt: skip
    out = tmp_path / "hf"
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert (out / "tokenizer.json").is_file()
    assert list(out.glob("model*.safetensors"))


def test_bad_checkpoint_values_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match="checkpoint.async_mode='sometimes'"):
        config(tmp_path, "--checkpoint.async_mode", "sometimes")


@pytest.mark.parametrize("key", ["folder", "export_folder", "initial_load_path"])
def test_a_url_of_an_unsupported_scheme_is_refused_naming_the_key(tmp_path, key):
    with pytest.raises(ConfigError, match=rf"checkpoint.{key}='ftp://example/run': the ftp:// scheme is not supported"):
        config(tmp_path, f"--checkpoint.{key}", "ftp://example/run")


def test_an_object_store_url_is_used_as_given_not_under_the_dump_folder(tmp_path):
    from titan_train.run.checkpointing import resolve_folder

    cfg = config(tmp_path, "--checkpoint.folder", "memory://bucket/run")
    assert resolve_folder(cfg, cfg.checkpoint.folder) == "memory://bucket/run"
    assert resolve_folder(cfg, "checkpoint") == str(tmp_path / "checkpoint")


def test_args_added_since_checkpoints_were_written_leave_the_fingerprint_at_their_old_value(tmp_path):
    import dataclasses

    from titan_models.llama3 import FLAVORS
    from titan_train.run.checkpointing import fingerprint

    cfg, args = config(tmp_path), FLAVORS["tiny"]
    assert {"tie_word_embeddings", "mtp_layers"}.isdisjoint(fingerprint(cfg, args)["args"])
    assert fingerprint(cfg, dataclasses.replace(args, mtp_layers=1))["args"]["mtp_layers"] == 1
