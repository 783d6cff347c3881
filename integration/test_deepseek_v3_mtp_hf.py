"""DeepSeek-V3 folders with their multi-token prediction layer, into Titan and back: transformers saves a tiny
DeepseekV3 folder (its config.json declares num_nextn_predict_layers = 1), and the MTP layer is added as DeepSeek's
released folders hold it: model.layers.<n_layers>.{enorm, hnorm, eh_proj, shared_head.norm}, a block like the last
one (experts one tensor each, the selection bias), and copies of the embedding and head (embed_tokens,
shared_head.head). Titan's MTP module holds exactly the folder's tensors; an export writes the same names and
values; transformers loads the export as it loads the folder, reporting the MTP layer's tensors (and only those) as
unexpected (its DeepseekV3 ignores model.layers.61.* by name, the 671B's MTP layer; a smaller model's is reported);
a run from `hf:<folder>` trains the module (mtp_loss_1) and exports it. Reference: transformers' DeepseekV3ForCausalLM
in float32; tensors compared exactly; logits atol 1e-4; first loss rtol 1e-5.
"""

import dataclasses
import json
import re

import pytest
import torch

# The integration session installs transformers (nox -s integration).
import transformers
from safetensors.torch import load_file, save_file

from hf_checks import first_batch_loss_by_transformers, hf_model, ours_from, save_deepseek_v3_folder, tokens
from launch_helpers import ROOT, run_titan
from titan_checkpoint import CheckpointMismatchError, export_safetensors, import_hf_checkpoint, load_hf_into_model
from titan_models import get_model_spec
from titan_models.deepseek_v3 import DeepseekV3HFAdapter

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized")
SEQ_LEN, BATCH, N_LAYERS = 64, 2, 2
MTP = f"model.layers.{N_LAYERS}."
CONFIG = dict(vocab_size=2048, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_attention_heads=4,
              num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, kv_lora_rank=32,
              qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, routed_scaling_factor=2.5,
              max_position_embeddings=512, bos_token_id=0, eos_token_id=1, num_hidden_layers=N_LAYERS,
              q_lora_rank=24, n_group=4, topk_group=2, first_k_dense_replace=1)  # fmt: skip


def mtp_layer_tensors(folder) -> dict[str, torch.Tensor]:
    """An MTP layer for the folder's model in Hugging Face's names, every tensor distinct (norms and selection
    biases off their initial values), with DeepSeek's copies of the folder's embedding and head."""
    adapter = DeepseekV3HFAdapter.from_hf_config(json.loads((folder / "config.json").read_text()))
    assert adapter.args.mtp_layers == 1  # transformers' default, written into the folder
    model = get_model_spec("deepseek_v3").model_cls(adapter.args)
    model.init_weights(seed=7)
    state = {fqn: tensor.detach().clone() for fqn, tensor in model.state_dict().items() if fqn.startswith("mtp.")}
    generator = torch.Generator().manual_seed(1)
    for fqn, tensor in state.items():
        if "norm" in fqn:
            tensor.uniform_(0.5, 1.5, generator=generator)
        elif fqn.endswith("expert_bias"):
            tensor.uniform_(-0.05, 0.05, generator=generator)
    layer = {key: t.contiguous() for key, t in adapter.to_hf(state).items()}
    main = load_file(folder / "model.safetensors")
    for copy_key, source in adapter.hf_copies().items():
        layer[copy_key] = main[source].clone()
    return layer


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mtp") / "hf"
    save_deepseek_v3_folder(transformers.DeepseekV3Config(**CONFIG), folder)
    assert json.loads((folder / "config.json").read_text())["num_nextn_predict_layers"] == 1
    tensors = load_file(folder / "model.safetensors")
    assert not any(key.startswith(MTP) for key in tensors)
    save_file({**tensors, **mtp_layer_tensors(folder)}, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def folder_mtp_tensors(folder) -> dict[str, torch.Tensor]:
    return {key: t for key, t in load_file(folder / "model.safetensors").items() if key.startswith(MTP)}


def assert_mtp_module_is_the_folders(model, folder) -> None:
    """Every tensor of the model's MTP module equals the folder's, through the adapter's layout (experts stacked)."""
    adapter = DeepseekV3HFAdapter(model.args)
    expected = adapter.from_hf(folder_mtp_tensors(folder))
    ours = {fqn: t for fqn, t in model.state_dict().items() if fqn.startswith("mtp.")}
    assert sorted(expected) == sorted(ours)
    for fqn, tensor in ours.items():
        torch.testing.assert_close(tensor, expected[fqn], atol=0, rtol=0, msg=fqn)


def test_the_import_fills_the_mtp_module_with_the_folders_tensors(folder):
    name, ours = ours_from(folder)
    assert (name, ours.args.mtp_layers) == ("deepseek_v3", 1)
    assert_mtp_module_is_the_folders(ours, folder)
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens()), hf_model(folder)(tokens()).logits, atol=1e-4, rtol=0)


def test_switched_off_an_import_skipping_the_mtp_layer_fails(folder, monkeypatch):
    _, ours = ours_from(folder)
    with torch.no_grad():
        ours.mtp["1"].eh_proj.weight.add_(1)  # what an import leaving the module at its init would hold
    with pytest.raises(AssertionError, match="mtp.1.eh_proj.weight"):
        assert_mtp_module_is_the_folders(ours, folder)
    monkeypatch.setattr(DeepseekV3HFAdapter, "skips_hf_key", lambda self, key: key.startswith(MTP))
    with pytest.raises(CheckpointMismatchError, match=MTP.replace(".", r"\.")):
        ours_from(folder)


def test_a_model_without_mtp_loads_the_folders_main_model(folder):
    """model.mtp_layers = 0 on the folder: the MTP layer is left unread, the main model is the folder's."""
    _, with_mtp = ours_from(folder)
    args = dataclasses.replace(with_mtp.args, mtp_layers=0)
    model = get_model_spec("deepseek_v3").model_cls(args)
    model.init_weights(seed=123)
    load_hf_into_model(model, folder, DeepseekV3HFAdapter(args))
    assert not any(fqn.startswith("mtp.") for fqn in model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(model(tokens()), hf_model(folder)(tokens()).logits, atol=1e-4, rtol=0)


def transformers_loading_info(folder) -> dict[str, set[str]]:
    _, info = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, output_loading_info=True)
    return {kind: set(info[kind]) for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")}


def test_the_export_writes_the_folders_names_and_values_and_transformers_loads_it(folder, tmp_path):
    import_hf_checkpoint(folder, tmp_path / "ckpt")
    export = tmp_path / "export"
    export_safetensors(tmp_path / "ckpt", export, dtype=torch.float32)
    theirs, ours = load_file(folder / "model.safetensors"), load_file(export / "model.safetensors")
    assert sorted(ours) == sorted(theirs)
    for key, tensor in theirs.items():
        torch.testing.assert_close(ours[key], tensor, atol=0, rtol=0, msg=key)
    assert json.loads((export / "config.json").read_text())["num_nextn_predict_layers"] == 1
    # transformers: the MTP layer's tensors, copies included, are unexpected (it has no MTP layer), its experts under
    # transformers' fused names (one gate_up_proj, one down_proj); nothing is missing or mismatched.
    unexpected = {re.sub(r"mlp\.experts\.\d+\.(gate|up)_proj\.weight", "mlp.experts.gate_up_proj", key)
                  for key in folder_mtp_tensors(folder)}  # fmt: skip
    unexpected = {re.sub(r"mlp\.experts\.\d+\.down_proj\.weight", "mlp.experts.down_proj", key) for key in unexpected}
    assert f"{MTP}mlp.experts.gate_up_proj" in unexpected and f"{MTP}embed_tokens.weight" in unexpected
    info = transformers_loading_info(export)
    assert info == {"missing_keys": set(), "unexpected_keys": unexpected, "mismatched_keys": set()}
    assert info == transformers_loading_info(folder)
    with torch.no_grad():
        torch.testing.assert_close(hf_model(export)(tokens(1)).logits, hf_model(folder)(tokens(1)).logits, atol=0,
                                   rtol=0)  # fmt: skip


def train_from(folder, dump, steps: int, *options: str):
    proc = run_titan(["--config", str(ROOT / "configs" / "deepseek_v3_debug.toml"), "--model.flavor", f"hf:{folder}",
                      "--training.seq_len", str(SEQ_LEN), "--training.local_batch_size", str(BATCH),
                      "--training.steps", str(steps), "--metrics.log_freq", "1", "--job.dump_folder", str(dump),
                      "--checkpoint.initial_load_path", str(folder), "--validation.enable", "false",
                      "--checkpoint.enable", "true", "--checkpoint.export_safetensors", "true",
                      "--checkpoint.export_dtype", "float32", *options], nproc=1)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def test_a_run_from_the_folder_trains_its_mtp_module_and_exports_it(folder, tmp_path):
    """3 steps on one process from hf:<folder>, model.mtp_layers left "auto" (the folder's): the first (main) loss is
    transformers' of that batch, mtp_loss_1 is reported, and the export holds the trained module in the folder's
    names, its copies the trained embedding and head."""
    dump = tmp_path / "run"
    train_from(folder, dump, 3)
    assert json.loads((dump / "hf" / "config.json").read_text())["num_nextn_predict_layers"] == 1
    rows = [json.loads(line) for line in (dump / "metrics.jsonl").read_text().splitlines()]
    assert all("mtp_loss_1" in row for row in rows)
    assert rows[0]["loss"] == pytest.approx(first_batch_loss_by_transformers(folder, 1, SEQ_LEN, BATCH), rel=1e-5)
    exported = load_file(dump / "hf" / "model.safetensors")
    assert sorted(exported) == sorted(load_file(folder / "model.safetensors"))
    before = folder_mtp_tensors(folder)
    assert not torch.equal(exported[f"{MTP}eh_proj.weight"], before[f"{MTP}eh_proj.weight"])
    assert torch.equal(exported[f"{MTP}embed_tokens.weight"], exported["model.embed_tokens.weight"])
    assert torch.equal(exported[f"{MTP}shared_head.head.weight"], exported["lm_head.weight"])


def test_a_run_with_mtp_layers_0_drops_the_folders_module_and_says_so(folder, tmp_path):
    dump = tmp_path / "run"
    proc = train_from(folder, dump, 1, "--model.mtp_layers", "0")
    log = proc.stdout + proc.stderr
    assert log.count("model.mtp_layers = 0 drops the 1 MTP module(s)") == 1, log[-3000:]
    rows = [json.loads(line) for line in (dump / "metrics.jsonl").read_text().splitlines()]
    assert not any(key.startswith("mtp_loss") for key in rows[0])
    assert rows[0]["loss"] == pytest.approx(first_batch_loss_by_transformers(folder, 1, SEQ_LEN, BATCH), rel=1e-5)
    assert not any(key.startswith(MTP) for key in load_file(dump / "hf" / "model.safetensors"))
    assert json.loads((dump / "hf" / "config.json").read_text())["num_nextn_predict_layers"] == 0
