"""The training loop on one process: learning, gradient accumulation, mixed precision, determinism."""

import pytest
import torch

from titan_train.config import load_config, parse_argv
from titan_train.run.distributed import init_distributed
from titan_train.run.trainer import Trainer


def trainer(tmp_path, *overrides: str) -> Trainer:
    argv = [
        "--job.dump_folder",
        str(tmp_path),
        "--training.seq_len",
        "64",
        "--training.local_batch_size",
        "4",
        "--metrics.log_freq",
        "1000",
        *overrides,
    ]
    config = load_config(parse_argv(argv))
    return Trainer(config, init_distributed(config))


def test_debug_model_loss_drops_within_30_steps(tmp_path):
    t = trainer(tmp_path, "--training.steps", "30", "--model.flavor", "debug", "--lr_scheduler.warmup_steps", "3")
    losses = t.train()
    assert len(losses) == 30
    # The bar comes from the run itself: a model that learns nothing stays near its first loss.
    assert sum(losses[-5:]) / 5 < 0.8 * losses[0], losses


def test_gradient_accumulation_equals_the_large_batch(tmp_path):
    big = trainer(tmp_path, "--model.flavor", "tiny", "--training.local_batch_size", "8", "--training.steps", "2")
    accum = trainer(
        tmp_path,
        "--model.flavor",
        "tiny",
        "--training.local_batch_size",
        "4",
        "--training.global_batch_size",
        "8",
        "--training.steps",
        "2",
    )
    assert accum.layout.accumulation_steps == 2
    for _ in range(2):
        loss_big, norm_big, _ = big.step()
        loss_acc, norm_acc, _ = accum.step()
        assert loss_acc == pytest.approx(loss_big, rel=1e-5)
        assert norm_acc == pytest.approx(norm_big, rel=1e-4)
    for (name, p_big), p_acc in zip(big.model.named_parameters(), accum.model.parameters(), strict=True):
        torch.testing.assert_close(p_acc, p_big, rtol=1e-5, atol=1e-6, msg=name)


def test_deterministic_runs_repeat_bit_for_bit(tmp_path):
    """Bit-for-bit repeats; and the flag really switched torch's deterministic algorithms on (on CPU the
    kernels are deterministic anyway, so the repeat alone would pass without it)."""
    args = ("--model.flavor", "tiny", "--training.steps", "3", "--training.deterministic", "true")
    torch.use_deterministic_algorithms(False)
    try:
        first = trainer(tmp_path, *args)
        assert torch.are_deterministic_algorithms_enabled()
        assert first.train() == trainer(tmp_path, *args).train()
    finally:
        torch.use_deterministic_algorithms(False)
    trainer(tmp_path, "--model.flavor", "tiny", "--training.steps", "3")
    assert not torch.are_deterministic_algorithms_enabled()


def test_bfloat16_compute_tracks_float32(tmp_path):
    args = ("--model.flavor", "tiny", "--training.steps", "5")
    fp32 = trainer(tmp_path, *args).train()
    bf16 = trainer(tmp_path, *args, "--training.mixed_precision_param", "bfloat16").train()
    # bf16 keeps ~3 significant digits; over 5 steps the losses stay within 2%.
    assert bf16 == pytest.approx(fp32, rel=2e-2)
    assert bf16 != fp32


def test_metrics_file_has_one_record_per_logged_step(tmp_path):
    import json

    trainer(tmp_path, "--model.flavor", "tiny", "--training.steps", "4", "--metrics.log_freq", "2").train()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 4]
    assert {"step", "loss", "grad_norm", "lr", "tps", "mfu", "memory"} <= records[0].keys()


def _nan_output_once(model, at_call: int):
    """Make the model's final hidden states, so its logits, NaN on its `at_call`-th forward (1-based). The norm,
    not the head: the chunked loss bypasses the head's hooks."""
    calls = {"n": 0}

    def hook(module, args, output):
        calls["n"] += 1
        return output * float("nan") if calls["n"] == at_call else output

    return model.norm.register_forward_hook(hook)


def test_nan_loss_stops_before_the_update_naming_the_step(tmp_path):
    from titan_debug import NonFiniteError

    t = trainer(tmp_path, "--model.flavor", "tiny", "--training.steps", "5")
    _nan_output_once(t.model, at_call=3)
    before = {}
    with pytest.raises(NonFiniteError, match=r"step 3: loss=nan.*debug.nan_policy='stop'"):
        for step in range(1, 6):
            if step == 3:
                before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
            t.step()
    for name, param in t.model.named_parameters():
        assert torch.equal(param, before[name]), f"{name} was updated by the NaN step"


def test_nan_stops_the_run_before_its_checkpoint(tmp_path):
    """Through the trainer's own loop (train()): steps 1 and 2 are saved, the NaN step 3 is not."""
    from titan_debug import NonFiniteError

    t = trainer(tmp_path, "--model.flavor", "tiny", "--training.steps", "5", "--checkpoint.enable", "true",
                "--checkpoint.interval", "1")  # fmt: skip
    _nan_output_once(t.model, at_call=3)
    with pytest.raises(NonFiniteError, match=r"step 3: loss=nan"):
        t.train()
    assert sorted(p.name for p in (tmp_path / "checkpoint").iterdir()) == ["step-1", "step-2"]


def test_nan_policy_skip_leaves_the_weights_and_goes_on(tmp_path):
    t = trainer(tmp_path, "--model.flavor", "tiny", "--training.steps", "4", "--debug.nan_policy", "skip")
    _nan_output_once(t.model, at_call=2)
    t.step()
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    loss, _, _ = t.step()
    assert loss != loss  # NaN
    assert all(torch.equal(p, before[n]) for n, p in t.model.named_parameters())
    loss, _, _ = t.step()
    assert loss == loss and t.step_count == 3


def test_tensorboard_and_profiler_write_where_documented(tmp_path):
    trainer(tmp_path, "--model.flavor", "tiny", "--training.steps", "4", "--metrics.log_freq", "2",
            "--metrics.enable_tensorboard", "true", "--profiling.enable_profiling", "true",
            "--profiling.profile_freq", "2", "--profiling.profile_warmup", "1").train()  # fmt: skip
    assert list((tmp_path / "tb" / "titan" / "rank0").glob("events.out.tfevents.*"))
    traces = sorted(p.parent.name for p in (tmp_path / "profile_traces").glob("iteration_*/rank0_trace.json"))
    assert traces == ["iteration_2", "iteration_4"]


@pytest.mark.slow  # 30 steps of two runs (~35 s): the float8 interface is the next test's too, in lower_bound's run
def test_float8_emulated_tracks_bfloat16_over_30_steps(tmp_path):
    args = ("--model.flavor", "debug", "--training.steps", "30", "--lr_scheduler.warmup_steps", "3",
            "--training.mixed_precision_param", "bfloat16")  # fmt: skip
    bf16 = trainer(tmp_path, *args).train()
    f8 = trainer(tmp_path, *args, "--float8.enable", "true", "--float8.emulate", "true").train()
    # float8 rounds every matmul input to 3 mantissa bits (e4m3): each step's loss stays within 3% of bf16.
    assert f8 == pytest.approx(bf16, rel=3e-2)
    assert f8 != bf16
    assert sum(f8[-5:]) / 5 < 0.8 * f8[0]


def test_float8_on_a_cpu_emulates_by_default_at_the_speed_of_the_plain_run(tmp_path, caplog):
    """float8.emulate = "auto" (the default) on a CPU: emulated matmuls, said in the float8 line, and a step in
    about the time of the same run without float8 (a ratio within this run: torch's CPU _scaled_mm is a
    reference implementation, ~2x to hundreds of times slower by CPU)."""
    import logging
    import time

    from torchao.float8.float8_linear import Float8Linear

    def seconds_per_step(t: Trainer) -> float:
        t.step()  # the first step pays for allocation and dispatch caches
        start = time.perf_counter()
        for _ in range(3):
            t.step()
        return (time.perf_counter() - start) / 3

    args = ("--model.flavor", "debug", "--training.steps", "4")
    plain = seconds_per_step(trainer(tmp_path / "plain", *args))
    with caplog.at_level(logging.INFO, logger="titan.float8"):
        f8 = trainer(tmp_path / "float8", *args, "--float8.enable", "true")
    assert "emulated: this device has no float8 matmul units" in caplog.text
    layers = [m for m in f8.model.modules() if isinstance(m, Float8Linear)]
    assert layers and all(m.config.emulate for m in layers)
    ratio = seconds_per_step(f8) / plain
    assert ratio < 4.0, f"a float8 step took {ratio:.1f}x the plain step"


def test_float8_config_errors_name_the_field(tmp_path):
    from titan_train.config import ConfigError

    with pytest.raises(ConfigError, match="float8.recipe='fp8' is not allowed"):
        trainer(tmp_path, "--float8.recipe", "fp8")
    with pytest.raises(ConfigError, match="float8"):
        trainer(tmp_path, "--float8.recipe", "rowwise", "--float8.enable_fsdp_float8_all_gather", "true")


def test_tps_and_mfu_match_an_independent_count(tmp_path):
    """Tokens counted where the model receives them and timed by this test's clock, against the metric line's
    `tps`; `mfu` against the documented formula: tps x (6 N + 12 L H D T) / peak, N counted on the live model."""
    import json
    import time

    from titan_debug import peak_flops

    t = trainer(tmp_path, "--model.flavor", "debug", "--training.steps", "7", "--metrics.log_freq", "3")
    tokens_by_step, step_ends = {}, {}  # this test's own count and clock, not the trainer's
    t.model.register_forward_pre_hook(
        lambda module, args: tokens_by_step.__setitem__(t.step_count + 1, args[0].numel())
    )
    trainer_step = t.step

    def timed_step():
        result = trainer_step()
        step_ends[t.step_count] = time.perf_counter()
        return result

    t.step = timed_step
    t.train()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 3, 6, 7]
    for previous, record in zip(records[1:-1], records[2:], strict=True):  # windows of 3 and 1 steps
        steps = range(previous["step"] + 1, record["step"] + 1)
        tokens = sum(tokens_by_step[s] for s in steps)
        assert tokens == len(steps) * 4 * 64
        seconds = step_ends[record["step"]] - step_ends[previous["step"]]
        assert record["tps"] == pytest.approx(tokens / seconds, rel=0.05)

    args = t.model_args
    non_embedding = sum(p.numel() for name, p in t.model.named_parameters() if "tok_embeddings" not in name)
    flops_per_token = 6 * non_embedding + 12 * args.n_layers * args.n_heads * (args.dim // args.n_heads) * 64
    peak = peak_flops(torch.device("cpu"), torch.float32)
    for record in records:
        assert record["mfu"] == pytest.approx(record["tps"] * flops_per_token / peak, rel=1e-9)


@pytest.mark.parametrize("native", [False, True], ids=["emulated", "native"])
def test_bf16_on_a_cpu_without_native_bf16_is_warned_about_and_mfu_stays_a_fraction(
    tmp_path, monkeypatch, caplog, native
):
    import json
    import logging

    import titan_train.run.reporting as reporting

    monkeypatch.setattr(reporting, "cpu_has_native_bf16", lambda: native)
    t = trainer(tmp_path, "--model.flavor", "tiny", "--training.steps", "2", "--metrics.log_freq", "1",
                "--training.mixed_precision_param", "bfloat16", "--training.seq_len", "16")  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="titan"):
        t.train()
    warned = [r.message for r in caplog.records if "without native bf16" in r.message]
    if native:
        assert warned == []
    else:
        (message,) = warned
        assert "training.mixed_precision_param='bfloat16'" in message and "float32" in message
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(r["mfu"] is None or 0 < r["mfu"] <= 1 for r in records)
