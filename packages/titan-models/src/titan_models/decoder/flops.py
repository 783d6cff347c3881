"""The decoder's parameter counts and training FLOPs per token, for MFU."""

from __future__ import annotations

from torch import nn

from titan_models.decoder.args import DecoderArgs
from titan_models.decoder.mixer_flops import delta_rule_flops_per_token
from titan_models.decoder.mixer_params import gated_deltanet_params


def num_params(model: nn.Module, exclude_embedding: bool = True) -> int:
    """Parameters of `model` (works on the meta device and on DTensors, whose numel is global).

    The token embedding is a lookup, not a matmul, so it is excluded from FLOP estimates by default; the
    output projection is a matmul and is counted (a tied one once, as the output projection).
    """
    total = sum(p.numel() for p in model.parameters())
    embeddings, output = getattr(model, "tok_embeddings", None), getattr(model, "output", None)
    tied = embeddings is not None and output is not None and output.weight is embeddings.weight
    if exclude_embedding and embeddings is not None and not tied:
        total -= embeddings.weight.numel()
    return total


def count_params(args: DecoderArgs, exclude_embedding: bool = True, active: bool = False) -> int:
    """num_params of Decoder(args), from the shapes alone. active: count only what one token computes with
    (in a sparse layer the router, top_k routed experts and the shared experts), as MFU needs. The MTP modules
    (args.mtp_layers) count their own parameters: three norms, eh_proj and a block of the last block's kind."""
    attention = _attention_params(args)
    norms = 2 * args.dim
    total = args.dim + args.vocab_size * args.dim
    for layer_id in range(args.n_layers):
        mixer = gated_deltanet_params(args.linear_attention) if args.is_linear_attention(layer_id) else attention
        total += mixer + norms + _feed_forward_params(args, layer_id, active)
    mtp_module = 3 * args.dim + 2 * args.dim * args.dim + attention + norms
    total += args.mtp_layers * (mtp_module + _feed_forward_params(args, args.n_layers - 1, active))
    if not exclude_embedding and not args.tie_word_embeddings:
        total += args.vocab_size * args.dim
    return total


def _attention_params(args: DecoderArgs) -> int:
    mla = args.mla
    if mla is None:
        q_dim, kv_dim = args.n_heads * args.head_dim, args.num_kv_heads * args.head_dim
        biases = q_dim + 2 * kv_dim + args.dim if args.attention_bias else 0
        sinks = args.n_heads if args.attention_sinks else 0
        gate = args.dim * q_dim if args.attention_output_gate else 0
        return (
            2 * args.dim * q_dim + 2 * args.dim * kv_dim + (2 * args.head_dim if args.qk_norm else 0) + biases + sinks
        ) + gate
    q_width = args.n_heads * mla.qk_head_dim
    queries = args.dim * q_width if mla.q_lora_rank is None else mla.q_lora_rank * (args.dim + 1 + q_width)
    keys_values = args.dim * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank
    keys_values += mla.kv_lora_rank * args.n_heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    return queries + keys_values + args.n_heads * mla.v_head_dim * args.dim


def _feed_forward_params(args: DecoderArgs, layer_id: int, active: bool) -> int:
    if not args.is_sparse(layer_id):
        return 3 * args.dim * args.hidden_dim
    moe = args.moe
    routed = moe.top_k if active else moe.num_experts
    router = (args.dim + moe.router_bias) * moe.num_experts
    expert_biases = routed * (2 * moe.hidden_dim + args.dim) if moe.expert_proj_bias else 0
    shared_gate = args.dim if moe.shared_expert_gate else 0
    return router + 3 * args.dim * moe.hidden_dim * (routed + moe.num_shared_experts) + expert_biases + shared_gate


def flops_per_token(args: DecoderArgs, seq_len: int) -> int:
    """Training FLOPs per token: 6 * N + 6 * n_heads * (qk_head_dim + v_head_dim) * (sum over blocks of the keys a
    block attends over) -- with full attention everywhere 6 * n_layers * n_heads * (qk_head_dim + v_head_dim) *
    seq_len (12 * n_layers * n_heads * head_dim * seq_len where queries, keys and values share one head width).

    6 * N (N = non-embedding parameters a token is computed with: a mixture of experts counts its active
    experts only, so MFU is not inflated by experts a token never visits): each weight does one
    multiply-add (2 FLOPs) per token in the forward pass and two in the backward pass (gradients w.r.t.
    inputs and weights). The second term is the attention scores (QK^T) and weighted values (AV), which
    have no parameters: n_heads * (qk_head_dim + v_head_dim) * keys multiply-adds per token per layer,
    times 3 for fwd + bwd, times 2 FLOPs. Causal masking is ignored, as in PaLM (Chowdhery et al. 2022,
    appendix B) and TorchTitan: a full layer counts seq_len keys per query.

    A sliding layer (args.window_for(layer) = W, GPT-OSS's every other layer) counts min(W, seq_len) keys per query
    instead of seq_len: its kernel skips the keys outside the window, so counting them would inflate MFU by work
    never done. The same convention as above (no causal halving): a window of seq_len or more counts as full.

    With MTP modules (args.mtp_layers = D) each depth is one more block in both terms and one more pass through
    the shared output head: 6 * D * vocab_size * dim more, the head being counted once in N. An MTP block is of the
    last block's kind (its window too).

    A linear-attention block (Qwen3-Next's Gated DeltaNet) attends over no keys; it counts the chunked gated delta
    rule instead (mixer_flops.delta_rule_flops_per_token: the intra-chunk products, the triangular solves and the
    state's reads and update, times 3), its projections and short convolution being weights in N.
    """
    qk, v = (args.mla.qk_head_dim, args.mla.v_head_dim) if args.mla is not None else (args.head_dim, args.head_dim)
    mtp_heads = 6 * args.mtp_layers * args.vocab_size * args.dim
    keys = sum(attended_keys(args, layer_id, seq_len) for layer_id in range(args.n_layers))
    keys += args.mtp_layers * attended_keys(args, args.n_layers - 1, seq_len)
    linear = sum(args.is_linear_attention(layer_id) for layer_id in range(args.n_layers))
    delta_rule = linear * delta_rule_flops_per_token(args.linear_attention, seq_len) if linear else 0
    return 6 * count_params(args, active=True) + mtp_heads + 6 * args.n_heads * (qk + v) * keys + delta_rule


def attended_keys(args: DecoderArgs, layer_id: int, seq_len: int) -> int:
    """Keys a query of block `layer_id` is counted to attend over (causal masking ignored): seq_len, or the
    block's sliding window where that is shorter; none in a linear-attention block (its recurrent state's work,
    O(heads * key_head_dim * value_head_dim) per token, flops_per_token counts apart)."""
    if args.is_linear_attention(layer_id):
        return 0
    window = args.window_for(layer_id)
    return seq_len if window is None else min(window, seq_len)
