"""Multi-token prediction in training (model.mtp_layers, training.mtp_loss_weight*): the loss is main + lambda x
the mean of the depths' losses, computed here by hand from the model on the same batch; the reported loss is the
main one; losses fall; lambda switches at its step; layouts not wired yet are refused naming the key."""

import json

import pytest
import torch
import torch.nn.functional as F

from titan_train.config import ConfigError, load_config, parse_argv
from titan_train.config.model_args import model_args
from titan_train.config.parallel_layout import resolve_layout
from titan_train.data.documents import document_kwargs
from titan_train.run.distributed import init_distributed
from titan_train.run.trainer import Trainer

BASE = ("--training.seq_len", "64", "--training.local_batch_size", "4", "--model.mtp_layers", "1")


def config_of(tmp_path, *overrides: str):
    return load_config(parse_argv(["--job.dump_folder", str(tmp_path), *BASE, *overrides]))


def trainer(tmp_path, *overrides: str, batches=None) -> Trainer:
    config = config_of(tmp_path, *overrides)
    return Trainer(config, init_distributed(config), batches=batches)


def metrics(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "documents",
    [(), ("--model.attention_mask", "block_causal", "--model.positions", "document")],
    ids=["one_document_per_row", "packed_documents"],
)
def test_first_step_loss_is_main_plus_lambda_times_mtp_by_hand(tmp_path, documents):
    """Reference: the model's own forward(return_mtp=True) and mtp_losses on the batch, the sum written here.
    fp32, rel 1e-5."""
    torch.manual_seed(0)
    t = trainer(tmp_path, "--model.flavor", "tiny", "--training.mtp_loss_weight", "0.25", *documents)
    vocab = t.model_args.vocab_size
    inputs = torch.randint(1, vocab, (4, 64))
    inputs[:, [0, 20, 41]] = t.tokenizer.bos_id  # document starts, where packed documents are on
    labels = torch.roll(inputs, -1, dims=1)
    make_kwargs = document_kwargs(t.config.model.attention_mask, t.config.model.positions, t.tokenizer.bos_id)
    kwargs = make_kwargs(inputs) if make_kwargs is not None else {}
    with torch.no_grad():
        logits, mtp_logits = t.model(inputs, return_mtp=True, **kwargs)
        main = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        (mtp,) = t.model.mtp_losses(mtp_logits, labels, **kwargs)
        # Under no_grad (evaluation) the loss is the main loss alone.
        assert t.parallel_model.forward_loss(inputs, labels).item() == pytest.approx(main.item(), rel=1e-5)
    total = t.parallel_model.forward_backward(inputs, labels).item()
    assert total == pytest.approx(main.item() + 0.25 * mtp.item(), rel=1e-5)
    assert mtp.item() != pytest.approx(main.item(), rel=1e-3)  # the two heads really differ

    t.dataloader = [(inputs, labels)]
    loss, _, _ = t.step()
    assert loss == pytest.approx(main.item(), rel=1e-5)  # the reported loss is the main one
    assert t.mtp_metrics["mtp_loss_1"] == pytest.approx(mtp.item(), rel=1e-5)
    assert t.mtp_metrics["mtp_loss_weight"] == 0.25


def test_main_and_mtp_losses_fall_and_lambda_switches_at_its_step(tmp_path):
    t = trainer(
        tmp_path, "--model.flavor", "debug", "--training.steps", "10", "--lr_scheduler.warmup_steps", "3",
        "--metrics.log_freq", "1", "--optimizer.lr", "3e-3", "--training.mtp_loss_weight_after", "6",
        "--training.mtp_loss_weight_late", "0.1",
    )  # fmt: skip
    losses = t.train()
    rows = metrics(tmp_path)
    assert [row["loss"] for row in rows] == pytest.approx(losses)
    assert [row["mtp_loss_weight"] for row in rows] == [0.3] * 6 + [0.1] * 4
    mtp = [row["mtp_loss_1"] for row in rows]
    # The bar comes from the run itself: a model that learns nothing stays near its first loss.
    assert sum(losses[-3:]) / 3 < 0.9 * losses[0], losses
    assert sum(mtp[-3:]) / 3 < 0.9 * mtp[0], mtp


def test_lambda_schedule():
    from titan_train.run.mtp_loss import MTPLoss

    config = load_config(parse_argv(["--training.mtp_loss_weight_after", "3", "--training.mtp_loss_weight", "0.5"]))
    assert [MTPLoss(config, 1).weight_at(step) for step in range(1, 6)] == [0.5, 0.5, 0.5, 0.1, 0.1]
    never = MTPLoss(load_config(parse_argv([])), 1)
    assert {never.weight_at(step) for step in (1, 10**6)} == {0.3}


def test_mtp_layers_reach_the_model_args_and_auto_chunking_stays_on(tmp_path):
    config = config_of(tmp_path, "--model.flavor", "debug", "--training.seq_len", "2048")
    assert model_args(config).mtp_layers == 1
    plain = config_of(tmp_path, "--model.flavor", "debug", "--training.seq_len", "2048", "--model.mtp_layers", "0")
    assert resolve_layout(config, 1).loss_chunk_tokens == resolve_layout(plain, 1).loss_chunk_tokens > 0


@pytest.mark.parametrize("gradients", ["in_forward", "recompute"])
def test_chunked_loss_computes_every_head_as_the_plain_loss(tmp_path, gradients):
    """training.loss_chunk_tokens = 16 (8 chunks of a 128-token micro-batch) against the plain loss, same seed and
    batch: total loss, main and depth losses (rel 1e-5) and every gradient (rel 1e-4, atol 1e-6) equal; the head
    module is never called under chunking (its forward hook counts: 2 calls, main and depth 1, on the plain one)."""
    torch.manual_seed(0)
    inputs = torch.randint(1, 256, (2, 64))
    labels = torch.roll(inputs, -1, dims=1)
    results = []
    for chunk in ("0", "16"):
        t = trainer(
            tmp_path, "--model.flavor", "tiny", "--training.local_batch_size", "2", "--training.loss_chunk_tokens",
            chunk, "--training.loss_chunk_gradients", gradients, "--training.mtp_loss_weight", "0.5",
        )  # fmt: skip
        assert t.layout.loss_chunk_tokens == int(chunk)
        head_calls = []
        t.model.output.register_forward_hook(lambda *_, calls=head_calls: calls.append(1))
        t.mtp_loss.take()
        total = t.parallel_model.forward_backward(inputs, labels).item()
        ((main, (depth,)),) = t.mtp_loss.take()
        grads = {name: p.grad.clone() for name, p in t.model.named_parameters()}
        results.append((total, main.item(), depth.item(), grads, len(head_calls)))
    (total, main, depth, grads, calls), (c_total, c_main, c_depth, c_grads, c_calls) = results
    assert (calls, c_calls) == (2, 0)
    assert (c_total, c_main, c_depth) == pytest.approx((total, main, depth), rel=1e-5)
    assert total == pytest.approx(main + 0.5 * depth, rel=1e-5)
    assert grads.keys() == c_grads.keys() and any(name.startswith("mtp.") for name in grads)
    for name, grad in grads.items():
        torch.testing.assert_close(c_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    "argv, world, message",
    [
        (["--model.mtp_layers", "-1"], 1, "model.mtp_layers=-1 must be >= 0"),
        (["--parallelism.pipeline_parallel_degree", "2", "--parallelism.pipeline_parallel_schedule", "ZBVZeroBubble"],
         2, "schedule='ZBVZeroBubble': that schedule splits each backward into an input and a weight pass"),
        (["--model.name", "hyena", "--model.flavor", "tiny"], 1, "model 'hyena' has no multi-token prediction"),
    ],
)  # fmt: skip
def test_bad_mtp_settings_are_refused_naming_the_key(tmp_path, argv, world, message):
    with pytest.raises(ConfigError) as error:
        resolve_layout(config_of(tmp_path, *argv), world)
    assert message in str(error.value)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--training.mtp_loss_weight", "-0.1"], "training.mtp_loss_weight=-0.1 must be >= 0"),
        (["--training.mtp_loss_weight_late", "-1"], "training.mtp_loss_weight_late=-1.0 must be >= 0"),
        (["--training.mtp_loss_weight_after", "-2"], "training.mtp_loss_weight_after=-2 must be >= 0"),
    ],
)
def test_bad_weights_are_refused(tmp_path, argv, message):
    with pytest.raises(ConfigError) as error:
        config_of(tmp_path, *argv)
    assert message in str(error.value)
