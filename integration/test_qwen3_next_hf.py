"""A Qwen3-Next folder written by transformers itself (save_pretrained of a tiny random Qwen3NextConfig: the shape of
titan-models' tests/qwen3_next/test_hf_parity.py, with the trainer's 2048-token vocabulary), trained on FSDP 2 from its
weights and exported back into what transformers loads, with the trained model's logits.

References and tolerances: transformers' Qwen3NextForCausalLM in float32 (eager attention and experts, its torch
gated delta rule); the trainer's first loss rtol 1e-5 (reductions run in another order); logits atol 1e-4.
"""

import pytest
import torch

# The integration session installs transformers (nox -s integration).
import transformers

import hf_checks
from hf_checks import first_batch_loss_by_transformers, ours_from, tokens, train_from_folder_and_export
from titan_checkpoint import ModelState, load_checkpoint

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized")
SEQ_LEN, BATCH = 64, 2
# An unusual order (full attention first and last), 3 query heads per key/value head, partial RoPE, a dense layer
# among sparse ones, a shared expert twice an expert's width.
CONFIG = dict(
    vocab_size=2048, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=6,
    num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
    layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention"],
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=8, linear_num_key_heads=2,
    linear_num_value_heads=4, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
    shared_expert_intermediate_size=64, norm_topk_prob=True, mlp_only_layers=[2], rms_norm_eps=1e-6,
    bos_token_id=0, eos_token_id=1,
)  # fmt: skip


def eager_hf_model(folder) -> torch.nn.Module:
    return transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """The folder, its norms, gates and decay parameters moved off their initial values (transformers starts the
    zero-centred norms at 0 and the gated norm at 1, where a mix-up of the two conventions would not show)."""
    torch.manual_seed(0)
    model = transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(**CONFIG))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(-0.5, 0.5) if "linear_attn" not in name else param.uniform_(0.5, 1.5)
            elif name.endswith(("A_log", "dt_bias")):
                param.uniform_(-1.0, 1.0)
            elif "experts" in name or "shared_expert" in name:
                param.normal_(std=0.2)
    folder = tmp_path_factory.mktemp("qwen3_next") / "hf"
    model.save_pretrained(folder)
    return folder


def test_training_starts_from_the_folders_weights_and_exports_what_transformers_loads(hf_folder, tmp_path, monkeypatch):
    """3 steps on FSDP 2 from the folder: the first loss is transformers' loss of that batch; the export at the end
    loads in transformers with no key missing or unexpected and the trained model's logits."""
    dump = tmp_path / "run"
    rows = train_from_folder_and_export("qwen3_next", hf_folder, dump, SEQ_LEN, BATCH)
    monkeypatch.setattr(hf_checks, "hf_model", eager_hf_model)
    assert rows[0]["loss"] == pytest.approx(first_batch_loss_by_transformers(hf_folder, 2, SEQ_LEN, BATCH), rel=1e-5)

    theirs, info = transformers.AutoModelForCausalLM.from_pretrained(
        dump / "hf", dtype=torch.float32, attn_implementation="eager", experts_implementation="eager",
        output_loading_info=True,
    )  # fmt: skip
    assert {k: v for k, v in info.items() if v} == {}, info
    _, trained = ours_from(hf_folder)
    load_checkpoint(dump / "checkpoint", {"model": ModelState(trained)})
    _, before = ours_from(hf_folder)
    for name in ("A_log", "dt_bias", "in_proj_qkvz.weight"):  # the linear layers trained, and so exported trained
        assert not torch.equal(before.get_parameter(f"layers.1.linear_attn.{name}"),
                               trained.get_parameter(f"layers.1.linear_attn.{name}")), name  # fmt: skip
    with torch.no_grad():
        torch.testing.assert_close(theirs.eval()(tokens(2)).logits, trained(tokens(2)), atol=1e-4, rtol=0)
