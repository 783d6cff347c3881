"""Qwen3 and Qwen3-MoE folders written by transformers itself (`save_pretrained` of tiny random configs), into
Titan and back: logits, the auxiliary loss and its gradient, the trainer's first loss, greedy tokens, and a
model trained on FSDP 2 then exported.

References and tolerances: transformers' Qwen3ForCausalLM / Qwen3MoeForCausalLM in float32; logits atol 1e-4;
auxiliary loss rtol 1e-5 and its router gradients atol 1e-6; the trainer's first loss rtol 1e-5 (reductions
run in another order).
"""

import json
import sys
from pathlib import Path

import pytest
import torch

# The integration session installs transformers (nox -s integration).
import transformers

from hf_checks import (
    assert_titan_generate_equals_transformers_greedy,
    first_batch_loss_by_transformers,
    hf_model,
    ours_from,
    tokens,
)
from launch_helpers import ROOT, run_titan
from titan_checkpoint import ModelState, load_checkpoint

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized")
BIN = Path(sys.executable).parent
RECIPES = {"qwen3": ROOT / "configs" / "debug_model.toml", "qwen3_moe": ROOT / "configs" / "qwen3_moe_debug.toml"}
SEQ_LEN, BATCH = 64, 2
SHAPE = dict(vocab_size=2048, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
             head_dim=32, max_position_embeddings=512, bos_token_id=0, eos_token_id=1)  # fmt: skip
CASES = {
    # head_dim 32 with hidden 64 and 4 heads: Qwen3's head width is its own; tied embeddings.
    "qwen3": lambda: transformers.Qwen3Config(num_hidden_layers=2, tie_word_embeddings=True, **SHAPE),
    # Sparse every 2nd layer (1 and 3) but layer 1 dense by mlp_only_layers: only layer 3 routes. Plain
    # top-k weights (norm_topk_prob false), tied embeddings.
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(
        num_hidden_layers=4,
        decoder_sparse_step=2,
        mlp_only_layers=[1],
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=False,
        tie_word_embeddings=True,
        **SHAPE,
    ),  # fmt: skip
    # Every layer sparse, renormalised top-k, untied.
    "qwen3_moe_all_sparse": lambda: transformers.Qwen3MoeConfig(
        num_hidden_layers=2,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        **SHAPE,
    ),  # fmt: skip
}


@pytest.fixture(scope="module", params=list(CASES))
def hf_folder(request, tmp_path_factory):
    """(case, folder) saved by transformers, norms moved off 1 so a mix-up (or an unpermuted q/k norm) shows."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CASES[request.param]())
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    folder = tmp_path_factory.mktemp(request.param) / "hf"
    model.save_pretrained(folder)
    return request.param, folder


def test_the_folder_alone_builds_our_model_with_transformers_logits(hf_folder):
    case, folder = hf_folder
    name, ours = ours_from(folder)
    assert name == ("qwen3" if case == "qwen3" else "qwen3_moe")
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens()), hf_model(folder)(tokens()).logits, atol=1e-4, rtol=0)


def test_aux_loss_and_its_gradient_equal_transformers(hf_folder):
    case, folder = hf_folder
    if case == "qwen3":
        pytest.skip("a dense model has no router")
    _, ours = ours_from(folder)
    theirs = hf_model(folder)
    ours(tokens(1))
    out = theirs(tokens(1), output_router_logits=True)
    torch.testing.assert_close(ours.aux_loss, out.aux_loss, rtol=1e-5, atol=0)
    ours.aux_loss.backward()
    out.aux_loss.backward()
    routers = [k for k, layer in ours.moe_layers().items()]
    assert routers == (["3"] if case == "qwen3_moe" else ["0", "1"])
    for key in routers:
        torch.testing.assert_close(
            ours.layers[key].feed_forward.router.gate.weight.grad,
            theirs.model.layers[int(key)].mlp.gate.weight.grad, atol=1e-6, rtol=1e-4,
        )  # fmt: skip


def trainer_options(case, folder, dump, steps):
    name = "qwen3" if case == "qwen3" else "qwen3_moe"
    return ["--config", str(RECIPES[name]), "--model.name", name, "--model.flavor", f"hf:{folder}",
            "--training.seq_len", str(SEQ_LEN), "--training.local_batch_size", str(BATCH),
            "--training.steps", str(steps), "--metrics.log_freq", "1", "--job.dump_folder", str(dump),
            "--checkpoint.initial_load_path", str(folder), "--validation.enable", "false"]  # fmt: skip


def test_training_starts_from_the_folders_weights_and_exports_what_transformers_loads(hf_folder, tmp_path):
    """3 steps on FSDP 2 from the folder: the first loss is transformers' loss of that batch (the language-model
    loss: the auxiliary loss is reported apart); the export at the end loads in transformers with the trained
    model's logits."""
    train_and_export(*hf_folder, tmp_path, [])


def test_an_expert_parallel_run_exports_what_transformers_loads(hf_folder, tmp_path):
    """The same on EP 2: the experts trained split over two ranks export whole."""
    case, folder = hf_folder
    if case != "qwen3_moe":
        pytest.skip("one sparse case is enough: the export path is the same")
    train_and_export(case, folder, tmp_path, ["--parallelism.expert_parallel_degree", "2"])


def train_and_export(case, folder, tmp_path, layout: list[str]) -> None:
    dump = tmp_path / "run"
    options = [*trainer_options(case, folder, dump, 3), *layout, "--checkpoint.enable", "true",
               "--checkpoint.export_safetensors", "true", "--checkpoint.export_dtype", "float32"]  # fmt: skip
    proc = run_titan(options, nproc=2)  # 2 ranks forked with torchrun's variables (forked_ranks)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (dump / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["loss"] == pytest.approx(first_batch_loss_by_transformers(folder, 2, SEQ_LEN, BATCH), rel=1e-5)
    if case != "qwen3":
        # That balancing lowers the imbalance: titan-models' tests/moe/test_balancing_effect.py.
        assert all(row["aux_loss"] > 0 and "expert_imbalance" in row for row in rows)
    export = dump / "hf"
    config = json.loads((export / "config.json").read_text())
    assert config["architectures"] == json.loads((folder / "config.json").read_text())["architectures"]
    name, trained = ours_from(folder)
    load_checkpoint(dump / "checkpoint", {"model": ModelState(trained)})
    _, before = ours_from(folder)
    assert not torch.equal(before.layers["0"].attention.q_norm.weight, trained.layers["0"].attention.q_norm.weight)
    with torch.no_grad():
        torch.testing.assert_close(hf_model(export)(tokens(2)).logits, trained(tokens(2)), atol=1e-4, rtol=0)


def test_titan_generate_from_the_transformers_folder_alone(hf_folder, tmp_path):
    """No recipe, no flavor: the folder's config.json and tokenizer; greedy tokens equal transformers'."""
    assert_titan_generate_equals_transformers_greedy(hf_folder[1], tmp_path)
