"""Llama 3 as a plain nn.Module: no parallelism here (see plan.py for how it is split).

Module names mirror TorchTitan's (and Meta's) so checkpoints and plans map by name.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from titan_models.llama3.args import Llama3Args
from titan_models.llama3.layers import RMSNorm, ScaledDotProductAttention, block_causal_mask  # noqa: F401 (exported)
from titan_models.llama3.rope import apply_rotary_emb, precompute_freqs_cis
from titan_models.mla.attention import MultiHeadLatentAttention
from titan_models.moe import MoE, RoutedTokens, add_aux_loss_grad, load_balance_loss
from titan_models.moe.local_tensor import local_tensor
from titan_models.seeded_init import SeededInit


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[bs, seqlen, n_kv_heads, head_dim] -> [bs, seqlen, n_kv_heads * n_rep, head_dim]; query head h
    reads key/value head h // n_rep."""
    if n_rep == 1:
        return x
    bs, seqlen, n_kv_heads, head_dim = x.shape
    return x[:, :, :, None, :].expand(bs, seqlen, n_kv_heads, n_rep, head_dim).reshape(bs, seqlen, -1, head_dim)


class Attention(nn.Module):
    """Causal grouped-query self-attention with RoPE; with args.qk_norm (Qwen3) each head's query and key are
    RMS-normalised before the rotation."""

    def __init__(self, args: Llama3Args):
        super().__init__()
        self.head_dim = args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.num_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.num_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)
        self.q_norm = RMSNorm(self.head_dim, eps=args.norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, eps=args.norm_eps) if args.qk_norm else None
        self.inner_attention = ScaledDotProductAttention(is_causal=True)

    def forward(
        self, x: torch.Tensor, freqs_cis: torch.Tensor, document_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """freqs_cis is the second positional argument because the tensor-parallel plan prepares
        inputs by position: (x, freqs_cis); document_ids (see ScaledDotProductAttention) is passed by
        keyword, which the plan leaves alone."""
        bs, seqlen, _ = x.shape
        xq, xk, xv = self.project(x, freqs_cis)

        # Repeat K/V explicitly rather than SDPA's enable_gqa, so every SDPA backend and context-parallel
        # ring attention see equal head counts.
        n_rep = xq.shape[2] // xk.shape[2]
        xk, xv = repeat_kv(xk, n_rep), repeat_kv(xv, n_rep)

        q, k, v = xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2)
        # Only when given: a swapped-in kernel (context parallelism) need not know the keyword otherwise.
        out = self.inner_attention(q, k, v) if document_ids is None else self.inner_attention(q, k, v, document_ids)
        return self.wo(out.transpose(1, 2).reshape(bs, seqlen, -1))

    def project(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values [bs, seqlen, heads, head_dim], queries and keys normalised (qk_norm) and
        rotated; shared with KV-cache decoding."""
        bs, seqlen, _ = x.shape
        # -1 heads, not n_heads: under tensor parallelism wq/wk/wv hold only this rank's heads.
        xq = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        if self.q_norm is not None:
            xq, xk = self.q_norm(xq), self.k_norm(xk)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        return xq, xk, xv

    def init_weights(self, init: SeededInit, init_std: float) -> None:
        for linear in (self.wq, self.wk, self.wv):
            init.trunc_normal_(linear.weight, std=0.02)
        init.trunc_normal_(self.wo.weight, std=init_std)
        for norm in (self.q_norm, self.k_norm):
            if norm is not None:
                norm.reset_parameters()


class FeedForward(nn.Module):
    """SwiGLU MLP: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def init_weights(self, init: SeededInit, init_std: float) -> None:
        init.trunc_normal_(self.w1.weight, std=0.02)
        for linear in (self.w2, self.w3):
            init.trunc_normal_(linear.weight, std=init_std)


class SharedExperts(FeedForward):
    """A mixture-of-experts layer's shared experts: the SwiGLU every token goes through, computed from this
    rank's part of each weight (`local_tensor`), as the routed experts are, so a parallel style can split its
    hidden units inside the layer (titan_parallel's MoETensorParallel) with no module hooks of its own. The
    same tensors and names as FeedForward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w1, w2, w3 = (local_tensor(linear.weight) for linear in (self.w1, self.w2, self.w3))
        return F.linear(F.silu(F.linear(x, w1)) * F.linear(x, w3), w2)


class TransformerBlock(nn.Module):
    """Pre-norm residual block: attention (grouped-query, or multi-head latent with args.mla) then SwiGLU, or a
    mixture of SwiGLU experts in a sparse layer."""

    def __init__(self, layer_id: int, args: Llama3Args):
        super().__init__()
        self.attention = MultiHeadLatentAttention(args) if args.mla is not None else Attention(args)
        self.feed_forward: FeedForward | MoE
        if args.is_sparse(layer_id):
            shared = args.moe.num_shared_experts * args.moe.hidden_dim
            self.feed_forward = MoE(args.dim, args.moe, SharedExperts(args.dim, shared) if shared else None)
        else:
            self.feed_forward = FeedForward(args.dim, args.hidden_dim)
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)
        # Smaller std for the projections that write into the residual stream, so its variance does not
        # grow with depth (TorchTitan's Llama 3 init).
        if args.depth_init:
            self.weight_init_std = 0.02 / (2 * (layer_id + 1)) ** 0.5
        else:
            self.weight_init_std = 0.02 / (2 * args.n_layers) ** 0.5

    def forward(
        self, x: torch.Tensor, freqs_cis: torch.Tensor, document_ids: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, RoutedTokens]:
        """The block's output; a sparse block also returns where its tokens went (RoutedTokens)."""
        h = x + self.attention(self.attention_norm(x), freqs_cis, document_ids=document_ids)
        out, routed = self.feed_forward_with_routing(self.ffn_norm(h))
        return h + out if routed is None else (h + out, routed)

    def feed_forward_with_routing(self, x: torch.Tensor) -> tuple[torch.Tensor, RoutedTokens | None]:
        if isinstance(self.feed_forward, MoE):
            return self.feed_forward(x)
        return self.feed_forward(x), None

    def init_weights(self, init: SeededInit) -> None:
        self.attention_norm.reset_parameters()
        self.ffn_norm.reset_parameters()
        self.attention.init_weights(init, self.weight_init_std)
        self.feed_forward.init_weights(init, self.weight_init_std)


class Llama3(nn.Module):
    """Llama 3 decoder.

    Pipeline stages delete what they do not own: entries of `layers` (a ModuleDict keyed "0".."n-1", so
    the remaining keys keep their global numbers) and `tok_embeddings` / `norm` / `output` set to None.
    Without tok_embeddings the input is already hidden states; without output the result is.
    """

    def __init__(self, args: Llama3Args):
        super().__init__()
        args.validate()
        self.args = args
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(args.vocab_size, args.dim)
        # Not persistent: derived from args, recomputed by init_weights, never checkpointed.
        self.register_buffer("freqs_cis", self._precompute_freqs_cis(), persistent=False)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(i, args) for i in range(args.n_layers)})
        self.norm: RMSNorm | None = RMSNorm(args.dim, eps=args.norm_eps)
        self.output: nn.Linear | None = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.tie_weights()
        self.positions: torch.Tensor | None = None
        self.aux_loss: torch.Tensor | None = None
        self.expert_load: torch.Tensor | None = None
        self.aux_loss_sum, self.routed_forwards = 0.0, 0
        self.loss_weight = 1.0

    def tie_weights(self) -> None:
        """With args.tie_word_embeddings, make output.weight the embedding's own parameter. Called again by
        init_weights, once the model is parallelized and materialized: to_empty() and tensor parallelism
        give each module a tensor of its own (TP shards both alike, over the vocabulary)."""
        if not self.args.tie_word_embeddings:
            return
        if (self.tok_embeddings is None) != (self.output is None):
            # A pipeline split put them in different stages: each stage would train its own copy.
            raise ValueError(
                "Llama3Args.tie_word_embeddings=True needs the token embedding and the output projection in "
                "one pipeline stage, but this part holds only one of them; train a tied model without pipeline "
                "parallelism (parallelism.pipeline_parallel_degree = 1)"
            )
        if self.tok_embeddings is not None:
            self.output.weight = self.tok_embeddings.weight

    def set_positions(self, positions: torch.Tensor | None) -> None:
        """The global positions of the tokens this model will be given, [seqlen], when it sees a slice of
        each sequence (context parallelism: set once, before training); None means 0..seqlen-1.
        A plain attribute, not a buffer: it is neither checkpointed nor touched by to_empty()."""
        self.positions = positions

    def _precompute_freqs_cis(self, device: torch.device | str | None = None) -> torch.Tensor:
        args = self.args
        return precompute_freqs_cis(args.rope_head_dim, args.max_seq_len, args.rope_theta, args.rope_scaling, device)

    def init_weights(self, buffer_device: torch.device | str | None = None, seed: int | None = None) -> None:
        """Recompute freqs_cis and initialize every parameter this (possibly partial) model holds.

        Call after `to_empty()`. Each parameter is drawn from a generator seeded by (seed, its name)
        -- see titan_models.seeded_init -- so the weights depend only on the seed and the device type,
        never on the number of devices, the pipeline split or the sharding. seed defaults to
        torch.initial_seed(), i.e. the value given to torch.manual_seed; distributed callers must seed
        every rank alike.
        """
        buffer_device = buffer_device or self.freqs_cis.device
        self.freqs_cis = self._precompute_freqs_cis(buffer_device)
        self.tie_weights()

        init = SeededInit(self, torch.initial_seed() if seed is None else seed)
        # A tied matrix is drawn once, as the output projection: std 1 would make the logits huge.
        if self.tok_embeddings is not None and not self.args.tie_word_embeddings:
            init.normal_(self.tok_embeddings.weight, std=1.0)
        for layer in self.layers.values():
            layer.init_weights(init)
        if self.norm is not None:
            self.norm.reset_parameters()
        output = self.output or (self.tok_embeddings if self.args.tie_word_embeddings else None)
        if output is not None:
            std = self.args.dim**-0.5
            init.trunc_normal_(output.weight, std=std, a=-3 * std, b=3 * std)

    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor | None = None, document_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """tokens: [bs, seqlen] ids, or [bs, seqlen, dim] hidden states when tok_embeddings is None.

        positions: optional global positions, [seqlen] or [bs, seqlen], for when this rank holds a slice of
        the sequence (context parallelism) or positions restart per document; RoPE follows them. None means
        those of `set_positions`, by default 0..seqlen-1.
        document_ids: optional [bs, seqlen] document of each token (packed sequences): attention is then
        block-causal, a token attends only to earlier tokens of its own document.
        Returns logits [bs, seqlen, vocab_size], or hidden states when output is None.
        """
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        positions = self.positions if positions is None else positions
        freqs_cis = self.freqs_cis if positions is None else self.freqs_cis[positions]
        routings = []
        for layer in self.layers.values():
            h = layer(h, freqs_cis, document_ids=document_ids)
            if isinstance(h, tuple):
                h, routed = h
                routings.append(routed)
        h = self._read_routing(h, routings)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h

    def moe_layers(self) -> dict[str, MoE]:
        """The mixture-of-experts layers this (possibly partial) model holds, by block key."""
        return {key: layer.feed_forward for key, layer in self.layers.items() if isinstance(layer.feed_forward, MoE)}

    def set_loss_weight(self, weight: float) -> None:
        """How much one unit of the next forwards' training loss weighs in the gradient (e.g. 1 / micro-batches):
        the auxiliary load-balancing loss joins the gradient with weight x moe.aux_loss_coef."""
        self.loss_weight = weight

    def _read_routing(self, h: torch.Tensor, routings: list[RoutedTokens]) -> torch.Tensor:
        """After the blocks: the forward's auxiliary loss (`aux_loss`, unweighted; None without one), put into
        the gradient through `h`, and when gradients are on (training) the tokens each expert got, added to
        `expert_load` ([moe layers, experts]). Read from the blocks' outputs, so activation checkpointing's
        recompute (which re-runs the routers) counts nothing twice."""
        if not routings:
            return h
        self.aux_loss = load_balance_loss(self.args.moe.load_balance, routings)
        if torch.is_grad_enabled():
            load = torch.stack([r.tokens_per_expert for r in routings])
            self.expert_load = load if self.expert_load is None else self.expert_load + load
            self.routed_forwards += 1
            if self.aux_loss is not None:
                self.aux_loss_sum += self.aux_loss.detach()
        return add_aux_loss_grad(h, self.aux_loss, self.args.moe.aux_loss_coef * self.loss_weight)

    def take_routing_stats(self) -> tuple[torch.Tensor | None, float, int]:
        """Since the last call (and reset): the tokens per expert routed in training forwards ([moe layers,
        experts], int64; None without MoE layers), the sum of their auxiliary losses and their number."""
        stats = (self.expert_load, float(self.aux_loss_sum), self.routed_forwards)
        self.expert_load, self.aux_loss_sum, self.routed_forwards = None, 0.0, 0
        return stats

    def update_expert_bias(self, load: torch.Tensor) -> None:
        """Auxiliary-loss-free balancing: move each MoE layer's selection bias against `load` (the step's
        tokens per expert over every data-parallel rank and micro-batch, as take_routing_stats orders them)."""
        if self.args.moe is None or self.args.moe.load_balance != "aux_loss_free":
            return
        for layer, layer_load in zip(self.moe_layers().values(), load, strict=True):
            layer.router.update_bias(layer_load)


Transformer = Llama3
"""The name of `Llama3` before 0.2; kept so existing imports work."""
