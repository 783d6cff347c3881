"""training.loss_chunk_tokens and activation_checkpoint.mode = "auto" through the config: the layout they
resolve to, their errors (named as written in TOML, raised before any model is built), and a real run of
the Trainer with both (the choice logged, the applied wrappers the chosen ones, the loss the plain one's)."""

import logging

import pytest

from titan_train.config import ConfigError, load_config, parse_argv
from titan_train.config.parallel_layout import resolve_layout
from titan_train.run.distributed import init_distributed
from titan_train.run.trainer import Trainer


def cli(*argv: str):
    return load_config(parse_argv(list(argv)))


@pytest.mark.parametrize(
    "options, message",
    [
        (["--training.loss_chunk_tokens", "-1"], r"training.loss_chunk_tokens=-1 must be >= 0 \(0: the plain loss\)"),
        (["--activation_checkpoint.mode", "auto"], r"activation_checkpoint.memory_budget_gib=0.0: mode='auto' needs"),
        (["--activation_checkpoint.mode", "auto", "--activation_checkpoint.memory_budget_gib", "-2"],
         "activation_checkpoint.memory_budget_gib=-2.0"),
    ],
)  # fmt: skip
def test_bad_memory_options_name_the_key(options, message):
    with pytest.raises(ConfigError, match=message):
        resolve_layout(cli(*options), world_size=1)


def test_auto_traces_one_micro_batch_of_this_ranks_tokens():
    auto = ["--activation_checkpoint.mode", "auto", "--activation_checkpoint.memory_budget_gib", "8"]
    ac = resolve_layout(cli(*auto, "--training.local_batch_size", "4", "--training.seq_len", "64"), 1)
    assert (ac.activation_checkpoint.trace_batch, ac.activation_checkpoint.auto_policies) == (
        (4, 64),
        ("none", "op", "full"),
    )
    cp_pp = ["--parallelism.context_parallel_degree", "2", "--parallelism.pipeline_parallel_degree", "2"]
    layout = resolve_layout(cli(*auto, *cp_pp, "--training.local_batch_size", "4", "--training.seq_len", "64"), 4)
    assert layout.activation_checkpoint.trace_batch == (1, 32)  # one pipeline micro-batch, half the sequence
    compiled_tp = ["--compile.enable", "true", "--parallelism.tensor_parallel_degree", "2"]
    layout = resolve_layout(cli(*auto, *compiled_tp), 2)
    assert layout.activation_checkpoint.auto_policies == ("none", "op")  # compiled DTensor blocks refuse "full"


def trainer(tmp_path, *overrides: str) -> Trainer:
    argv = ["--job.dump_folder", str(tmp_path), "--model.flavor", "tiny", "--training.seq_len", "64",
            "--training.local_batch_size", "4", "--training.steps", "2", "--metrics.log_freq", "1000",
            *overrides]  # fmt: skip
    config = load_config(parse_argv(argv))
    return Trainer(config, init_distributed(config))


def test_chunked_loss_and_auto_ac_train_like_the_plain_run(tmp_path, caplog):
    plain = trainer(tmp_path / "plain", "--training.loss_chunk_tokens", "0")
    with caplog.at_level(logging.INFO, logger="titan_parallel.ac.ac_budget"):
        lean = trainer(tmp_path / "lean", "--training.loss_chunk_tokens", "100", "--activation_checkpoint.mode",
                       "auto", "--activation_checkpoint.memory_budget_gib", "0.012")  # fmt: skip
    chosen = [record.getMessage() for record in caplog.records if "activation checkpointing auto" in record.message]
    assert len(chosen) == 1 and "predicted peak" in chosen[0], chosen
    kinds = [block["checkpoint"] for block in lean.parallel_model.applied_layout()[0]["blocks"].values()]
    assert kinds != [None] * len(kinds), kinds  # this budget is below the unchecked step's peak
    assert lean.parallel_model.applied_layout()[0]["loss_chunk_tokens"] == 100
    for _ in range(2):
        loss_plain, norm_plain, _ = plain.step()
        loss_lean, norm_lean, _ = lean.step()
        assert loss_lean == pytest.approx(loss_plain, rel=1e-5)
        assert norm_lean == pytest.approx(norm_plain, rel=1e-4)


def test_auto_loss_chunk_follows_the_micro_batch_and_the_head():
    """ "auto" (the default): the tiny model (dim 64, vocabulary 2048) chunks 4 x 64 tokens in 256 (dim / 2 is
    under the floor), at any micro-batch size; 64 tokens per micro-batch are no more than dim: the plain loss."""

    def chunk(*options: str, world: int = 1) -> int:
        return resolve_layout(
            cli("--model.flavor", "tiny", "--training.seq_len", "64", *options), world
        ).loss_chunk_tokens

    assert chunk("--training.local_batch_size", "4") == 256
    assert chunk("--training.local_batch_size", "1") == 0
    pipeline = ["--parallelism.pipeline_parallel_degree", "2", "--training.local_batch_size", "4"]
    assert chunk(*pipeline, world=2) == 0  # a pipeline micro-batch of one sequence
    assert chunk(*pipeline, "--parallelism.pipeline_parallel_microbatch_size", "2", world=2) == 256
    assert chunk("--training.local_batch_size", "64", "--training.seq_len", "512") == 256  # 128 chunks
    assert chunk("--training.local_batch_size", "4", "--training.loss_chunk_tokens", "96") == 96
    assert chunk("--model.name", "hyena", "--training.local_batch_size", "4") == 0  # no declared head
    layout = resolve_layout(cli("--training.loss_chunk_gradients", "recompute"), 1)
    assert layout.loss_chunk_gradients == "recompute"
    with pytest.raises(ConfigError, match="training.loss_chunk_tokens='many' must be an integer or 'auto'"):
        cli("--training.loss_chunk_tokens", "many")
