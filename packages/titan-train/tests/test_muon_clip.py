"""MuonClip (optimizer.muon_clip_threshold, run/qk_clip.py) through the trainer on one process: the step's largest
logit per layer in metrics.jsonl, the clip keeping the logits of the step's own batches at the threshold or under
(rtol 1e-4) after each step, on grouped-query (Llama 3), q/k-norm (Qwen3), latent (DeepSeek-V3) and hybrid
linear-attention (Qwen3-Next) models; and the config's checks."""

import json

import pytest
import torch

from titan_train.config import ConfigError, load_config, parse_argv
from titan_train.run.distributed import init_distributed
from titan_train.run.qk_clip import NoQKClip
from titan_train.run.trainer import Trainer

TINY = ["--model.flavor", "tiny", "--training.seq_len", "32", "--training.local_batch_size", "2",
        "--training.deterministic", "true", "--metrics.log_freq", "1", "--lr_scheduler.warmup_steps", "0",
        "--optimizer.name", "Muon", "--validation.enable", "false"]  # fmt: skip
MODELS = {
    "llama3": ["--model.name", "llama3"],
    "qwen3": ["--model.name", "qwen3"],
    "deepseek_v3": ["--model.name", "deepseek_v3"],
    "deepseek_v3_mtp": ["--model.name", "deepseek_v3", "--model.mtp_layers", "1"],  # the MTP depth's attention too
    "qwen3_next": ["--model.name", "qwen3_next"],
}


def trainer(tmp_path, *overrides: str) -> Trainer:
    config = load_config(parse_argv(["--job.dump_folder", str(tmp_path), *overrides]))
    return Trainer(config, init_distributed(config))


def recording_inputs(t: Trainer) -> dict:
    """Each softmax attention's inputs in the step's forwards, by its slot: [(args, kwargs), ..]."""
    seen = {}

    def keep(slot):
        return lambda module, args, kwargs: seen.setdefault(slot, []).append((args, kwargs))

    for slot, module in t.qk_clip.attentions:
        module.register_forward_pre_hook(keep(slot), with_kwargs=True)
    return seen


@torch.no_grad()
def max_logits_now(t: Trainer, inputs: dict) -> torch.Tensor:
    """[layers with softmax attention] each layer's largest logit, under the trainer's weights now, on the inputs
    it had in the step (a layer's own logits, whatever the clip did to the layers before it)."""
    t.qk_clip.start_step()
    for slot, module in t.qk_clip.attentions:
        for args, kwargs in list(inputs[slot]):
            module(*args, **kwargs)
    return torch.stack([module.max_logit.max() for _, module in sorted(t.qk_clip.attentions, key=lambda a: a[0])])


@pytest.mark.parametrize("model", MODELS)
def test_the_clip_brings_each_layer_to_the_threshold(tmp_path, model):
    """The threshold is half the first step's largest logit (measured with a threshold nothing reaches), so every
    run clips. The logits the clip reads are the step's forward's, before the update; learning rates of 1e-6 make
    the update's own change negligible: after each step every layer's logits on the inputs it saw are at most tau,
    and a layer that passed tau is at tau (rtol 1e-4)."""
    common = [*TINY, *MODELS[model], "--training.steps", "3", "--optimizer.lr", "1e-6",
              "--optimizer.muon_lr", "1e-6"]  # fmt: skip
    probe = trainer(tmp_path / "probe", *common, "--optimizer.muon_clip_threshold", "1e9")
    probe.step()
    tau = float(probe.qk_clip_metrics["max_logit"]) / 2

    t = trainer(tmp_path / "clip", *common, "--optimizer.muon_clip_threshold", str(tau))
    inputs = recording_inputs(t)
    for step in range(3):
        inputs.clear()
        t.step()
        seen = torch.stack([t.qk_clip_metrics[f"max_logit/{name}"] for _, name in t.qk_clip.names])
        after = max_logits_now(t, inputs)
        assert len(after) == len(seen) == len(t.qk_clip.names)
        assert (after <= tau * (1 + 1e-4)).all(), (tau, seen, after)
        clipped = seen > tau
        torch.testing.assert_close(after[clipped], torch.full_like(after[clipped], tau), rtol=1e-4, atol=0)
        assert clipped.any() or step > 0  # the first step's largest layer is twice tau


@pytest.mark.parametrize("model", ["llama3", "qwen3_next"])
def test_metrics_carry_the_largest_logit_per_layer(tmp_path, model, caplog):
    """metrics.jsonl: max_logit/layer_<i> for each softmax layer (Qwen3-Next's linear-attention layers have none)
    and max_logit, their max; the step line shows max_logit."""
    t = trainer(
        tmp_path, *TINY, "--model.name", model, "--training.steps", "2", "--optimizer.muon_clip_threshold", "50"
    )
    with caplog.at_level("INFO", logger="titan"):
        t.train()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    for line, row in zip(lines, rows, strict=True):
        assert f"max_logit {row['max_logit']:.2f}" in line, line
    softmax_layers = [i for i in range(t.model_args.n_layers) if not t.model_args.is_linear_attention(i)]
    assert len(softmax_layers) < t.model_args.n_layers or model == "llama3"
    for row in rows:
        per_layer = {key: value for key, value in row.items() if key.startswith("max_logit/")}
        assert sorted(per_layer) == sorted(f"max_logit/layer_{i}" for i in softmax_layers)
        assert all(0 < value < 50 for value in per_layer.values()), per_layer
        assert row["max_logit"] == max(per_layer.values())


def test_compiled_and_checkpointed_blocks_record_the_same_logits(tmp_path):
    """The recording is a side effect in the block's forward: under torch.compile with activation checkpointing,
    dynamo must be told the recompute need not replay it (qk_clip.py). Same first-step figures as eager (rtol
    1e-5: compiled kernels round differently)."""
    common = [*TINY, "--training.steps", "1", "--optimizer.muon_clip_threshold", "0.05"]
    eager = trainer(tmp_path / "eager", *common)
    eager.step()
    compiled = trainer(
        tmp_path / "compiled", *common, "--compile.enable", "true", "--activation_checkpoint.mode", "full"
    )
    compiled.step()
    for key, value in eager.qk_clip_metrics.items():
        torch.testing.assert_close(compiled.qk_clip_metrics[key], value, rtol=1e-5, atol=0, msg=key)


def test_off_by_default_and_nothing_recorded(tmp_path):
    t = trainer(tmp_path, *TINY, "--training.steps", "1")
    assert isinstance(t.qk_clip, NoQKClip)
    t.step()
    assert t.qk_clip_metrics == {}
    attentions = [m for m in t.model.modules() if hasattr(m, "record_max_logit")]
    assert attentions and all(not m.record_max_logit and m.max_logit is None for m in attentions)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["--optimizer.muon_clip_threshold", "-1"], r"optimizer.muon_clip_threshold=-1.0 must be >= 0"),
        (
            ["--optimizer.name", "AdamW", "--optimizer.muon_clip_threshold", "100"],
            r"optimizer.muon_clip_threshold=100.0 is MuonClip's, an option of Muon, but optimizer.name='AdamW'",
        ),
        (
            [
                "--optimizer.muon_clip_threshold",
                "100",
                "--parallelism.context_parallel_degree",
                "2",
                "--parallelism.context_parallel_implementation",
                "torch",
            ],
            r"with parallelism.context_parallel_implementation='torch'",
        ),
        (
            ["--optimizer.muon_clip_threshold", "100", "--lora.enable", "true"],
            r"with lora.enable=true",
        ),
        (
            ["--optimizer.muon_clip_threshold", "100", "--model.name", "hyena", "--model.flavor", "tiny"],
            r"model 'hyena' has no softmax attention",
        ),
    ],
)
def test_bad_values_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(parse_argv(["--optimizer.name", "Muon", *overrides]))
