"""Parameter counts and training FLOPs per token, for MFU."""

from __future__ import annotations

from torch import nn

from titan_models.llama3.args import Llama3Args


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


def count_params(args: Llama3Args, exclude_embedding: bool = True) -> int:
    """num_params of Transformer(args), from the shapes alone."""
    kv_dim = args.num_kv_heads * args.head_dim
    attention = 2 * args.dim * args.dim + 2 * args.dim * kv_dim
    feed_forward = 3 * args.dim * args.hidden_dim
    norms = 2 * args.dim
    total = args.n_layers * (attention + feed_forward + norms) + args.dim + args.vocab_size * args.dim
    if not exclude_embedding and not args.tie_word_embeddings:
        total += args.vocab_size * args.dim
    return total


def flops_per_token(args: Llama3Args, seq_len: int) -> int:
    """Training FLOPs per token: 6 * N + 12 * n_layers * n_heads * head_dim * seq_len.

    6 * N (N = non-embedding parameters): each weight does one multiply-add (2 FLOPs) per token in the
    forward pass and two in the backward pass (gradients w.r.t. inputs and weights). The second term is
    the attention scores (QK^T) and weighted values (AV), which have no parameters: 2 matmuls of
    n_heads * head_dim * seq_len multiply-adds per token per layer, times 3 for fwd + bwd, times 2
    FLOPs. Causal masking is ignored, as in PaLM (Chowdhery et al. 2022, appendix B) and TorchTitan.
    """
    return 6 * count_params(args) + 12 * args.n_layers * args.n_heads * args.head_dim * seq_len
