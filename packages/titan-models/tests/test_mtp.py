"""Multi-token prediction (decoder/mtp.py). Reference: DeepSeek-V3's equations (arXiv 2412.19437, eq. 21-25) written
out here in plain torch on our model's weights, the blocks taken as they are (tested on their own elsewhere); the
concatenation in the checkpoints' order [enorm(emb); hnorm(h)]. fp32, atol 1e-5."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import titan_models.decoder.model as decoder_model
from titan_models.decoder import Decoder
from titan_models.decoder.mtp import IGNORE_INDEX, document_ids_from_positions, mtp_targets
from titan_models.deepseek_v3 import FLAVORS as DEEPSEEK_V3
from titan_models.llama3 import FLAVORS as LLAMA3

FAMILIES = {"llama3": LLAMA3["tiny"], "deepseek_v3": DEEPSEEK_V3["tiny"]}

# Row 0: documents of 5, 4 and 3 tokens; row 1: one document of 12.
DOCS = torch.tensor([[0] * 5 + [1] * 4 + [2] * 3, [0] * 12])


def build(family: str, mtp_layers: int = 2, seed: int = 0, **changes) -> Decoder:
    args = dataclasses.replace(FAMILIES[family], mtp_layers=mtp_layers, **changes)
    with torch.device("meta"):
        model = Decoder(args)
    model.to_empty(device="cpu")
    model.init_weights(seed=seed)
    return model


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


# --- the shift rule -------------------------------------------------------------------------------------------


def test_ignored_positions_are_exactly_those_the_rule_names():
    tokens = torch.arange(100, 124).view(2, 12)
    labels = torch.arange(101, 125).view(2, 12)
    labels[1, 6] = IGNORE_INDEX  # a position the main loss ignores (e.g. a prompt token)
    depths = mtp_targets(tokens, labels, 3, DOCS)
    # Position t of depth k is kept iff t + k is in the row and in t's document. Written out by hand:
    kept = {
        1: ([0, 1, 2, 3, 5, 6, 7, 9, 10], [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]),  # row 1 loses 5: labels[1, 6] ignored
        2: ([0, 1, 2, 5, 6, 9], [0, 1, 2, 3, 5, 6, 7, 8, 9]),
        3: ([0, 1, 5], [0, 1, 2, 4, 5, 6, 7, 8]),
    }
    for k, depth in enumerate(depths, start=1):
        for row in range(2):
            expected = torch.full((12,), IGNORE_INDEX)
            for t in kept[k][row]:
                expected[t] = labels[row, t + k]
            assert depth.labels[row].tolist() == expected.tolist(), f"depth {k} row {row}"
            # Inputs: the token k ahead where kept (and for row 1 position 5 of depth 1, whose label the main loss
            # ignores but whose input is a token of its own document), 0 where the shift leaves row or document.
            for t in range(12):
                inside = t + k < 12 and DOCS[row, t + k] == DOCS[row, t]
                assert depth.inputs[row, t] == (tokens[row, t + k] if inside else 0), f"depth {k} row {row} t {t}"


def test_without_document_ids_only_the_row_end_is_ignored():
    tokens = torch.arange(10).view(1, 10)
    (d1, d2) = mtp_targets(tokens, tokens + 1, 2)
    assert d1.labels.tolist() == [[2, 3, 4, 5, 6, 7, 8, 9, 10, IGNORE_INDEX]]
    assert d2.labels.tolist() == [[3, 4, 5, 6, 7, 8, 9, 10, IGNORE_INDEX, IGNORE_INDEX]]


def test_document_ids_from_restarting_positions():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0], [3, 4, 0, 1, 2, 3]])
    ids = document_ids_from_positions(positions)
    assert ids.tolist() == [[1, 1, 1, 2, 2, 3], [0, 0, 1, 1, 1, 1]]


# --- the modules against the paper's equations ----------------------------------------------------------------


def reference_mtp(model: Decoder, tokens: torch.Tensor, labels: torch.Tensor):
    """Per-depth logits and losses of one unpacked batch, by the equations, the shift by index arithmetic."""
    args, seqlen = model.args, tokens.shape[1]
    eps, emb, head = args.norm_eps, model.tok_embeddings.weight, model.output.weight
    freqs = model.freqs_cis[:seqlen]
    h = emb[tokens]
    for block in model.layers.values():
        h = block(h, freqs).hidden  # h^0: the main model's last block output, before its final norm
    logits, losses = [], []
    for k in range(1, args.mtp_layers + 1):
        m = model.mtp[str(k)]
        ahead = torch.zeros_like(tokens)
        ahead[:, : seqlen - k] = tokens[:, k:]  # Emb(t_{i+k}); the tail is masked out of the loss below
        joined = torch.cat([rms_norm(emb[ahead], m.enorm.weight, eps), rms_norm(h, m.hnorm.weight, eps)], dim=-1)
        h = m.block(joined @ m.eh_proj.weight.T, freqs).hidden  # h^k = TRM_k(M_k [..; ..])
        z = rms_norm(h, m.shared_head.norm.weight, eps) @ head.T  # P^k = OutHead(h^k)
        logits.append(z)
        # L_MTP^k = -1/(T-k) sum_{i} log P^k_i[t_{i+1+k}] over the positions whose target is in the sequence.
        logp = z[:, : seqlen - k].log_softmax(-1)
        target = labels[:, k:]
        losses.append(-logp.gather(-1, target.unsqueeze(-1)).mean())
    return logits, losses


@pytest.mark.parametrize("family", FAMILIES)
def test_per_depth_logits_and_losses_equal_the_papers_equations(family):
    model = build(family, mtp_layers=2)
    torch.manual_seed(1)
    seq = torch.randint(0, model.args.vocab_size, (2, 17))
    tokens, labels = seq[:, :-1], seq[:, 1:]
    logits, mtp_logits = model(tokens, return_mtp=True)
    assert len(mtp_logits) == 2
    want_logits, want_losses = reference_mtp(model, tokens, labels)
    for k in range(2):
        torch.testing.assert_close(mtp_logits[k], want_logits[k], atol=1e-5, rtol=0)
    losses = model.mtp_losses(mtp_logits, labels)
    for k in range(2):
        torch.testing.assert_close(losses[k], want_losses[k], atol=1e-5, rtol=0)
    torch.testing.assert_close(logits, model(tokens), atol=0, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_mtp_loss_reaches_the_shared_embedding_head_and_main_blocks(family):
    model = build(family, mtp_layers=1)
    tokens = torch.randint(0, model.args.vocab_size, (1, 9))
    _, mtp_logits = model(tokens, return_mtp=True)
    model.mtp_losses(mtp_logits, tokens)[0].backward()
    for name in ("tok_embeddings.weight", "output.weight", "layers.0.attention_norm.weight", "mtp.1.eh_proj.weight"):
        grad = model.get_parameter(name).grad
        assert grad is not None and grad.abs().sum() > 0, name
    assert model.norm.weight.grad is None  # the main model's final norm is not on the MTP path


# --- packed documents: each depth's kept positions as if each document ran alone -------------------------------


def check_packed_equals_documents_alone(model: Decoder) -> None:
    torch.manual_seed(2)
    tokens = torch.randint(0, model.args.vocab_size, DOCS.shape)
    labels = torch.randint(0, model.args.vocab_size, DOCS.shape)
    positions = torch.stack([torch.cat([torch.arange(n) for n in row]) for row in ([5, 4, 3], [12])])
    _, packed = model(tokens, positions=positions, document_ids=DOCS, return_mtp=True)
    packed_losses = model.mtp_losses(packed, labels, positions=positions, document_ids=DOCS)
    # Positions that restart at each document say the same boundaries as document ids.
    for by_positions, by_ids in zip(model.mtp_losses(packed, labels, positions=positions), packed_losses, strict=True):
        torch.testing.assert_close(by_positions, by_ids, atol=0, rtol=0)
    D = model.args.mtp_layers
    alone_logits = [[] for _ in range(D)]
    alone_labels = [[] for _ in range(D)]
    for row, lengths in enumerate(([5, 4, 3], [12])):
        start = 0
        for n in lengths:
            cols = slice(start, start + n)
            _, alone = model(tokens[row : row + 1, cols], return_mtp=True)
            for k in range(1, D + 1):
                if n > k:  # positions start .. start+n-1-k have their token k ahead in the document
                    kept = slice(start, start + n - k)
                    torch.testing.assert_close(packed[k - 1][row, kept], alone[k - 1][0, : n - k], atol=1e-5, rtol=0)
                    alone_logits[k - 1].append(alone[k - 1][0, : n - k])
                    alone_labels[k - 1].append(labels[row, start + k : start + n])
            start += n
    for k in range(D):
        want = F.cross_entropy(torch.cat(alone_logits[k]), torch.cat(alone_labels[k]))
        torch.testing.assert_close(packed_losses[k], want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_documents_equal_each_document_alone(family):
    check_packed_equals_documents_alone(build(family, mtp_layers=3))


def test_dropping_the_document_boundary_rule_fails_the_packed_check(monkeypatch):
    """Switch-off check: with the shift allowed across documents the packed losses take wrong targets."""

    def across_documents(tokens, labels, depths, document_ids=None):
        return mtp_targets(tokens, labels, depths, None)

    monkeypatch.setattr(decoder_model, "mtp_targets", across_documents)
    with pytest.raises(AssertionError):
        check_packed_equals_documents_alone(build("llama3", mtp_layers=3))


# --- mtp_layers = 0 is the model without MTP ------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_mtp_adds_only_its_own_parameters_and_leaves_the_main_model_alone(family):
    plain, with_mtp = build(family, mtp_layers=0), build(family, mtp_layers=2)
    assert plain.mtp is None and not any(name.startswith("mtp") for name in plain.state_dict())
    extra = set(with_mtp.state_dict()) - set(plain.state_dict())
    assert set(plain.state_dict()) <= set(with_mtp.state_dict())
    assert {name.split(".")[1] for name in extra} == {"1", "2"} and all(n.startswith("mtp.") for n in extra)
    assert {
        "mtp.1.enorm.weight",
        "mtp.1.hnorm.weight",
        "mtp.1.eh_proj.weight",
        "mtp.1.shared_head.norm.weight",
    } <= extra
    for name, value in plain.state_dict().items():  # seeded by name: the shared weights are the same draws
        torch.testing.assert_close(with_mtp.state_dict()[name], value, atol=0, rtol=0)
    tokens = torch.randint(0, plain.args.vocab_size, (2, 8))
    out = plain(tokens)
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(with_mtp(tokens), out, atol=0, rtol=0)
    with pytest.raises(ValueError, match="mtp_layers > 0"):
        plain(tokens, return_mtp=True)


def test_mtp_layers_must_be_a_non_negative_integer():
    with pytest.raises(ValueError, match="mtp_layers=-1"):
        dataclasses.replace(LLAMA3["tiny"], mtp_layers=-1).validate()


def test_a_sparse_last_block_gives_sparse_mtp_blocks():
    from titan_models.moe import MoE

    model = build("deepseek_v3", mtp_layers=1)
    assert isinstance(model.layers["3"].feed_forward, MoE) and isinstance(model.mtp["1"].block.feed_forward, MoE)


def test_the_plan_names_the_mtp_modules_experts_for_expert_parallelism():
    from titan_models.decoder.plan import decoder_plan

    args = DEEPSEEK_V3["tiny"]
    assert decoder_plan(args).expert_fqns == ["layers.*.feed_forward.experts"]
    with_mtp = decoder_plan(dataclasses.replace(args, mtp_layers=2)).expert_fqns
    assert with_mtp == ["layers.*.feed_forward.experts", "mtp.*.block.feed_forward.experts"]
    model = build("deepseek_v3", mtp_layers=2)
    assert {f"mtp.{k}.block.feed_forward.experts" for k in (1, 2)} <= {name for name, _ in model.named_modules()}
    assert decoder_plan(dataclasses.replace(LLAMA3["tiny"], mtp_layers=1)).expert_fqns == []


# --- parameter counts and FLOPs -------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_count_params_counts_the_mtp_modules(family):
    from titan_models.decoder import count_params, flops_per_token, num_params

    model = build(family, mtp_layers=2)
    for exclude in (True, False):
        assert count_params(model.args, exclude_embedding=exclude) == num_params(model, exclude_embedding=exclude)
    args0 = dataclasses.replace(model.args, mtp_layers=0)
    # Each depth: its parameters (active), one more block of attention scores, one more pass of the shared head.
    per_depth = (count_params(model.args, active=True) - count_params(args0, active=True)) // 2
    qk, v = (args0.mla.qk_head_dim, args0.mla.v_head_dim) if args0.mla else (args0.head_dim, args0.head_dim)
    extra = 2 * 6 * (per_depth + args0.vocab_size * args0.dim + args0.n_heads * (qk + v) * 64)
    assert flops_per_token(model.args, 64) - flops_per_token(args0, 64) == extra


# --- Hugging Face names: model.layers.<n_layers + k - 1>.* ----------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_mtp_tensors_map_to_the_layer_after_the_last_and_back(family):
    from titan_models.deepseek_v3 import DeepseekV3HFAdapter
    from titan_models.llama3 import Llama3HFAdapter

    model = build(family, mtp_layers=2)
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-1, 1)  # every tensor distinct, norms and biases included
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    adapter = {"llama3": Llama3HFAdapter, "deepseek_v3": DeepseekV3HFAdapter}[family](model.args)
    hf = adapter.to_hf(state)
    assert sorted(hf) == sorted(adapter.hf_keys())
    n = model.args.n_layers
    for k in (1, 2):
        for name in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight"):
            torch.testing.assert_close(hf[f"model.layers.{n + k - 1}.{name}"], state[f"mtp.{k}.{name}"], atol=0, rtol=0)
    if family == "deepseek_v3":  # the last block is sparse: so is the MTP block, its experts one tensor each
        torch.testing.assert_close(hf[f"model.layers.{n}.mlp.experts.7.down_proj.weight"],
                                   state["mtp.1.block.feed_forward.experts.w2"][7].t(), atol=0, rtol=0)  # fmt: skip
        assert f"model.layers.{n + 1}.self_attn.kv_a_proj_with_mqa.weight" in hf
    else:
        assert f"model.layers.{n + 1}.mlp.gate_proj.weight" in hf
    back = adapter.from_hf(hf)
    assert sorted(back) == sorted(state)
    for key in state:
        torch.testing.assert_close(back[key], state[key], rtol=0, atol=0, msg=key)
    with pytest.raises(ValueError, match="mtp_layers=2"):
        adapter.to_hf_key("mtp.3.enorm.weight")
    with pytest.raises(ValueError, match="does not exist"):
        adapter.from_hf_key(f"model.layers.{n + 2}.enorm.weight")


def test_the_mtp_blocks_routing_has_a_ledger_of_its_own():
    model = build("deepseek_v3", mtp_layers=2)
    tokens = torch.randint(0, model.args.vocab_size, (2, 8))
    logits, mtp_logits = model(tokens, return_mtp=True)
    main, mtp = model.take_routing_stats(), model.mtp_routing.take()
    top_k = model.args.moe.top_k
    assert main.tokens_per_expert.shape[0] == len(model.moe_layers())  # the main rows unchanged by MTP
    assert mtp.tokens_per_expert.shape == (2, model.args.moe.num_experts) and mtp.forwards == 1
    assert mtp.tokens_per_expert.sum(-1).tolist() == [2 * 8 * top_k] * 2
    assert build("llama3", mtp_layers=1).mtp_routing is None and build("deepseek_v3", mtp_layers=0).mtp_routing is None


def test_the_mtp_blocks_auxiliary_loss_reaches_their_routers():
    moe = dataclasses.replace(FAMILIES["deepseek_v3"].moe, load_balance="aux_loss")
    model = build("deepseek_v3", mtp_layers=1, moe=moe)
    tokens = torch.randint(0, model.args.vocab_size, (2, 8))
    _, mtp_logits = model(tokens, return_mtp=True)
    assert model.mtp_routing.aux_loss is not None
    # A loss that does not read the routing weights' value path: only the auxiliary loss moves the gate.
    (0 * mtp_logits[0].sum()).backward()
    gate = model.mtp["1"].block.feed_forward.router.gate.weight.grad
    assert gate is not None and gate.abs().sum() > 0


def test_the_tensor_parallel_plan_splits_the_mtp_modules_as_a_block_of_the_last_kind():
    from titan_models.decoder.plan import decoder_tp_plan
    from titan_models.tp_styles import ExpertsHiddenShard

    assert not any(key.startswith("mtp.") for key in decoder_tp_plan(DEEPSEEK_V3["tiny"]))
    args = dataclasses.replace(DEEPSEEK_V3["tiny"], mtp_layers=1)
    plan = decoder_tp_plan(args)
    mtp = {key for key in plan if key.startswith("mtp.")}
    block = {key.replace("layers.*.", "mtp.*.block.") for key in plan if key.startswith("layers.*.")}
    assert block <= mtp
    assert {"mtp.*.enorm", "mtp.*.hnorm", "mtp.*.shared_head.norm", "mtp.*.eh_proj"} <= mtp
    last = plan[f"layers.{args.n_layers - 1}.feed_forward"]
    assert isinstance(last, ExpertsHiddenShard) and plan["mtp.*.block.feed_forward"] is last


def test_given_mtp_inputs_are_the_depths_inputs():
    """A caller that shifts the whole sequence (context parallelism) passes the depths' input tokens: the same
    tokens give the same logits, other tokens other logits (they really are read)."""
    model = build("llama3", mtp_layers=2)
    tokens = torch.randint(1, model.args.vocab_size, (2, 12))
    depths = mtp_targets(tokens, tokens, 2, DOCS)
    given = torch.stack([depth.inputs for depth in depths], dim=-1)
    _, computed = model(tokens, document_ids=DOCS, return_mtp=True)
    _, from_given = model(tokens, document_ids=DOCS, return_mtp=True, mtp_inputs=given)
    for got, want in zip(from_given, computed, strict=True):
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    _, other = model(tokens, document_ids=DOCS, return_mtp=True, mtp_inputs=given.roll(1, dims=1))
    assert not torch.allclose(other[0], computed[0])
