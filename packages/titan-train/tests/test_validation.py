"""[validation] on one process: the held-out split, the loss it reports, that it leaves training alone, and
the config errors; document masking's config errors. Multi-process parity: integration/
test_validation_and_documents.py."""

import json
import math

import pytest
import torch

from titan_train.config import ConfigError, build_config, load_config, parse_argv, validate
from titan_train.data.sources import HELD_OUT_BOOKS, resolve_dataset
from titan_train.run.distributed import init_distributed
from titan_train.run.trainer import Trainer

TINY = ["--model.flavor", "tiny", "--training.seq_len", "64", "--training.local_batch_size", "2"]


def trainer(tmp_path, *overrides: str) -> Trainer:
    config = load_config(parse_argv(["--job.dump_folder", str(tmp_path), *TINY, *overrides]))
    return Trainer(config, init_distributed(config))


def test_held_out_chapters_are_never_in_the_training_split():
    train = list(resolve_dataset("kjv").documents())
    held_out = list(resolve_dataset("kjv_validation").documents())
    assert len(held_out) == 87 and len(train) == 1189 - 87
    assert not set(train) & set(held_out)
    assert held_out[0].startswith("Now it came to pass in the days when the judges ruled")  # Ruth 1
    assert HELD_OUT_BOOKS == (
        "Ruth",
        "Esther",
        "Proverbs",
        "Ecclesiastes",
        "Song of Solomon",
        "Jonah",
        "Hebrews",
        "James",
    )


def test_training_losses_are_the_same_with_and_without_validation(tmp_path):
    common = ["--training.steps", "4", "--validation.freq", "2", "--validation.steps", "3"]
    plain = trainer(tmp_path / "plain", *common).train()
    validated = trainer(tmp_path / "validated", *common, "--validation.enable", "true", "--metrics.log_freq", "1")
    assert validated.train() == plain
    rows = [json.loads(line) for line in (tmp_path / "validated" / "metrics.jsonl").read_text().splitlines()]
    shown = {r["step"]: r for r in rows if "validation_loss" in r}
    assert sorted(shown) == [2, 4]
    assert all(math.isclose(r["validation_perplexity"], math.exp(r["validation_loss"])) for r in shown.values())


def test_validation_loss_is_the_mean_over_the_batches(tmp_path):
    """Reference: the plain model's loss on each batch of the held-out split, in order, averaged."""
    t = trainer(tmp_path, "--validation.enable", "true", "--validation.steps", "-1")
    from titan_train.data import build_dataloader
    from titan_train.run.validation import Validator

    validator = Validator(t.config, t.parallel_model, t.tokenizer, torch.device("cpu"))
    rng = torch.get_rng_state()
    found = validator.run()["validation_loss"]
    assert torch.equal(torch.get_rng_state(), rng)  # a dataloader draws its base seed from the torch RNG
    batches = [b for b in build_dataloader("kjv_validation", "", t.tokenizer, 64, 2, infinite=False) if len(b[0]) == 2]
    with torch.no_grad():
        losses = [torch.nn.functional.cross_entropy(t.model(x).flatten(0, 1), y.flatten()).item() for x, y in batches]
    assert len(losses) > 50
    assert found == pytest.approx(sum(losses) / len(losses), rel=1e-6)


def test_validation_steps_count_global_batches(tmp_path):
    """A global batch of 2 local batches (accumulation 2 on one process): validation.steps = 3 evaluates 3 global
    batches, the split's first 6 local batches, as 2 data-parallel ranks of the same recipe would."""
    t = trainer(tmp_path, "--training.global_batch_size", "4", "--validation.enable", "true", "--validation.steps", "3")
    from titan_train.data import build_dataloader
    from titan_train.run.validation import Validator

    assert t.layout.accumulation_steps == 2
    found = Validator(t.config, t.parallel_model, t.tokenizer, torch.device("cpu")).run()["validation_loss"]
    batches = iter(build_dataloader("kjv_validation", "", t.tokenizer, 64, 2, infinite=False))
    with torch.no_grad():
        losses = [
            torch.nn.functional.cross_entropy(t.model(x).flatten(0, 1), y.flatten()).item()
            for x, y in (next(batches) for _ in range(6))
        ]
    assert found == pytest.approx(sum(losses) / len(losses), rel=1e-6)


@pytest.mark.parametrize(
    "section, message",
    [
        ({"validation": {"freq": 0}}, r"validation\.freq=0 must be >= 1"),
        ({"validation": {"steps": 0}}, r"validation\.steps=0 must be >= 1, or -1"),
        ({"validation": {"seq_len": 0}}, r"validation\.seq_len=0 must be >= 1, or -1 for training\.seq_len"),
        (
            {"validation": {"enable": True, "local_batch_size": 4}, "parallelism": {"pipeline_parallel_degree": 2}},
            r"validation\.local_batch_size=4 differs from training\.local_batch_size=8; with pipeline",
        ),
        (
            {"validation": {"enable": True, "seq_len": 128}, "parallelism": {"context_parallel_degree": 2}},
            r"validation\.seq_len=128 differs from training\.seq_len=256; with context parallelism",
        ),
        (
            {
                "validation": {"enable": True},
                "parallelism": {"pipeline_parallel_degree": 2, "pipeline_parallel_schedule": "ZBVZeroBubble"},
            },
            r"validation\.enable=true with parallelism\.pipeline_parallel_schedule='ZBVZeroBubble': torch 2\.13 has "
            r"no forward-only pass for V-shaped schedules; use one of GPipe, 1F1B, Interleaved1F1B, "
            r"InterleavedZeroBubble",
        ),
        ({"validation": {"enable": True, "dataset": "nope"}}, r"validation\.dataset='nope' is not a known dataset"),
        (
            {"model": {"name": "hyena", "flavor": "tiny", "attention_mask": "block_causal"}},
            r"model\.attention_mask='block_causal' / model\.positions='sequence': model\.name='hyena' takes no "
            r"document ids or per-document positions",
        ),
        (
            {
                "model": {"attention_mask": "block_causal"},
                "parallelism": {"context_parallel_degree": 2, "context_parallel_implementation": "torch"},
            },
            r"needs parallelism\.context_parallel_implementation='titan'",
        ),
    ],
)
def test_bad_config_is_refused_naming_the_key(section, message):
    with pytest.raises(ConfigError, match=message):
        validate(build_config(section, []))


def test_unknown_attention_mask_is_refused():
    with pytest.raises(ConfigError, match=r"model\.attention_mask"):
        build_config({"model": {"attention_mask": "sliding"}}, [])
