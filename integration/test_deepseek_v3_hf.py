"""DeepSeek-V3 folders written by transformers itself (`save_pretrained` of tiny random DeepseekV3Config), into
Titan and back: logits, the trainer's first loss and an export transformers loads, greedy tokens.

Cases: a query latent (q_lora_rank) or direct queries, first_k_dense_replace > 0, group-limited routing
(n_group > 1), YaRN RoPE with its mscale. The selection biases (e_score_correction_bias) and the norms are
moved off their initial values, so a mix-up shows. Reference: transformers' DeepseekV3ForCausalLM in float32;
logits atol 1e-4; first loss rtol 1e-5.
"""

import json

import pytest
import torch

# The integration session installs transformers (nox -s integration).
import transformers

from hf_checks import (
    assert_titan_generate_equals_transformers_greedy,
    first_batch_loss_by_transformers,
    hf_model,
    ours_from,
    save_deepseek_v3_folder,
    tokens,
)
from launch_helpers import ROOT, run_titan
from titan_checkpoint import ModelState, load_checkpoint

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized")
SEQ_LEN, BATCH = 64, 2
SHAPE = dict(vocab_size=2048, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_attention_heads=4,
             num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, kv_lora_rank=32,
             qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, routed_scaling_factor=2.5,
             max_position_embeddings=512, bos_token_id=0, eos_token_id=1)  # fmt: skip
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707}  # fmt: skip
CASES = {
    # Query latent, groups of 2 experts with 2 of 4 groups open, a dense first layer, YaRN.
    "q_latent_groups_yarn": lambda: transformers.DeepseekV3Config(
        num_hidden_layers=3, q_lora_rank=24, n_group=4, topk_group=2, first_k_dense_replace=1,
        rope_parameters=YARN, **SHAPE),
    # Queries projected directly, no groups, every layer sparse, plain RoPE.
    "direct_queries": lambda: transformers.DeepseekV3Config(
        num_hidden_layers=2, q_lora_rank=None, n_group=1, topk_group=1, first_k_dense_replace=0, **SHAPE),
}  # fmt: skip


@pytest.fixture(scope="module", params=list(CASES))
def hf_folder(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param) / "hf"
    save_deepseek_v3_folder(CASES[request.param](), folder)
    return request.param, folder


def test_the_folder_alone_builds_our_model_with_transformers_logits(hf_folder):
    case, folder = hf_folder
    name, ours = ours_from(folder)
    assert name == "deepseek_v3"
    args = ours.args
    assert (args.mla.q_lora_rank is None) == (case == "direct_queries")
    assert args.moe.num_expert_groups == (4 if case != "direct_queries" else 1)
    assert any(layer.router.expert_bias.abs().sum() > 0 for layer in ours.moe_layers().values())
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens()), hf_model(folder)(tokens()).logits, atol=1e-4, rtol=0)


def test_training_starts_from_the_folders_weights_and_exports_what_transformers_loads(hf_folder, tmp_path):
    """3 steps on FSDP 2 from the folder: the first loss is transformers' loss of that batch; the export at
    the end (selection biases moved by the auxiliary-loss-free balancing included) loads in transformers with
    the trained model's logits."""
    case, folder = hf_folder
    dump = tmp_path / "run"
    options = ["--config", str(ROOT / "configs" / "deepseek_v3_debug.toml"), "--model.flavor", f"hf:{folder}",
               "--training.seq_len", str(SEQ_LEN), "--training.local_batch_size", str(BATCH),
               "--training.steps", "3", "--metrics.log_freq", "1", "--job.dump_folder", str(dump),
               "--checkpoint.initial_load_path", str(folder), "--validation.enable", "false",
               "--checkpoint.enable", "true", "--checkpoint.export_safetensors", "true",
               "--checkpoint.export_dtype", "float32"]  # fmt: skip
    proc = run_titan(options, nproc=2)  # 2 ranks forked with torchrun's variables (forked_ranks)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (dump / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["loss"] == pytest.approx(first_batch_loss_by_transformers(folder, 2, SEQ_LEN, BATCH), rel=1e-5)
    export = dump / "hf"
    assert json.loads((export / "config.json").read_text())["architectures"] == ["DeepseekV3ForCausalLM"]
    _, trained = ours_from(folder)
    load_checkpoint(dump / "checkpoint", {"model": ModelState(trained)})
    _, before = ours_from(folder)
    key = next(iter(trained.moe_layers()))
    assert not torch.equal(before.moe_layers()[key].router.expert_bias, trained.moe_layers()[key].router.expert_bias)
    with torch.no_grad():
        torch.testing.assert_close(hf_model(export)(tokens(2)).logits, trained(tokens(2)), atol=1e-4, rtol=0)


def test_titan_generate_from_the_transformers_folder_alone(hf_folder, tmp_path):
    """No recipe, no flavor: the folder's config.json and tokenizer; greedy tokens equal transformers'."""
    assert_titan_generate_equals_transformers_greedy(hf_folder[1], tmp_path)
