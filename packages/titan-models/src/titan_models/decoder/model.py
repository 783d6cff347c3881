"""The decoder as a plain nn.Module: no parallelism here (see plan.py for how it is split). Llama 3, Qwen3,
Qwen3-MoE and DeepSeek-V3 are all this model, built from different args (args.py).

Module names mirror TorchTitan's (and Meta's) so checkpoints and plans map by name.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from titan_models.decoder.args import DecoderArgs
from titan_models.decoder.block import TransformerBlock
from titan_models.decoder.layers import RMSNorm
from titan_models.decoder.mtp import IGNORE_INDEX, MTPModule, mtp_targets, shift_document_ids
from titan_models.decoder.rope import precompute_freqs_cis
from titan_models.moe import MoE
from titan_models.moe.routing_ledger import RoutingLedger, RoutingStats
from titan_models.seeded_init import SeededInit


class Decoder(nn.Module):
    """The decoder: token embedding -> n_layers x TransformerBlock -> RMSNorm -> output projection.

    Pipeline stages delete what they do not own: entries of `layers` (a ModuleDict keyed "0".."n-1", so
    the remaining keys keep their global numbers) and `tok_embeddings` / `norm` / `output` / `mtp` set to None.
    A stage after the first is given hidden states (floating point), not token ids; the last stage may still hold
    the embedding, for the MTP modules or a tied output projection (the plan's shared_input_fqns). Without
    output the result is hidden states.

    `routing` is the model's RoutingLedger (titan_models.moe) when its args declare a mixture of experts, None
    otherwise: the auxiliary loss, the expert loads and the routing statistics a trainer reads.

    `mtp` holds the multi-token prediction modules (decoder/mtp.py), keyed "1".."D", when args.mtp_layers > 0;
    None otherwise, and then the model, its state dict and its forward are those of a model without MTP.
    """

    def __init__(self, args: DecoderArgs):
        super().__init__()
        args.validate()
        self.args = args
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(args.vocab_size, args.dim)
        # Not persistent: derived from args, recomputed by init_weights, never checkpointed.
        self.register_buffer("freqs_cis", self._precompute_freqs_cis(), persistent=False)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(i, args) for i in range(args.n_layers)})
        self.norm: RMSNorm | None = RMSNorm(args.dim, eps=args.norm_eps, zero_centered=args.zero_centered_norm)
        self.output: nn.Linear | None = nn.Linear(args.dim, args.vocab_size, bias=False)
        # Built only with mtp_layers > 0, so a model without keeps its state dict names (and seeded init) unchanged.
        self.mtp: nn.ModuleDict | None = None
        if args.mtp_layers > 0:
            self.mtp = nn.ModuleDict({str(k): MTPModule(k, args) for k in range(1, args.mtp_layers + 1)})
        self.tie_weights()
        self.positions: torch.Tensor | None = None
        self.routing = RoutingLedger(args.moe, self.layers) if args.moe is not None else None
        # The MTP modules' sparse blocks keep a ledger of their own: the main ledger's rows (expert loads, bias
        # updates) stay those of the main blocks, whether or not a forward runs the modules.
        self.mtp_routing = RoutingLedger(args.moe, self.mtp) if args.moe is not None and self.mtp is not None else None

    def tie_weights(self) -> None:
        """With args.tie_word_embeddings, make output.weight the embedding's own parameter. Called again by
        init_weights, once the model is parallelized and materialized: to_empty() and tensor parallelism
        give each module a tensor of its own (TP shards both alike, over the vocabulary)."""
        if not self.args.tie_word_embeddings:
            return
        if self.output is not None and self.tok_embeddings is None:
            # A pipeline split that dropped the embedding from the last stage: the head would be a matrix of its own.
            raise ValueError(
                "Llama3Args.tie_word_embeddings=True needs the token embedding beside the output projection, but "
                "this part holds only the projection; a pipeline keeps a copy of the embedding on the last stage "
                "(the plan's shared_input_fqns)"
            )
        if self.output is not None:
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
        for module in (self.mtp or {}).values():
            module.init_weights(init)
        output = self.output or (self.tok_embeddings if self.args.tie_word_embeddings else None)
        if output is not None:
            std = self.args.dim**-0.5
            init.trunc_normal_(output.weight, std=std, a=-3 * std, b=3 * std)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
        return_mtp: bool = False,
        mtp_inputs: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """tokens: [bs, seqlen] ids, or [bs, seqlen, dim] hidden states (a pipeline stage after the first).

        positions: optional global positions, [seqlen] or [bs, seqlen], for when this rank holds a slice of
        the sequence (context parallelism) or positions restart per document; RoPE follows them. None means
        those of `set_positions`, by default 0..seqlen-1.
        document_ids: optional [bs, seqlen] document of each token (packed sequences): attention is then
        block-causal, a token attends only to earlier tokens of its own document.
        return_mtp: also return the MTP modules' logits, one [bs, seqlen, vocab_size] per depth (depth k at
        position t predicts token t + 1 + k; `mtp_losses` gives their losses). Needs mtp_layers > 0 and the
        embedding, the modules and the output head in this part (the whole model, or the last pipeline stage).
        mtp_inputs: optional [bs, seqlen, mtp_layers] input tokens of the depths (`mtp_targets(...)[k - 1].inputs`
        in column k - 1), for a caller that shifts the whole sequence before splitting it (context parallelism:
        a rank's last positions read tokens another rank holds) and for the last pipeline stage, which is given
        hidden states; None: shifted here from `tokens`. Read only with return_mtp.
        Returns logits [bs, seqlen, vocab_size], or hidden states when output is None; with return_mtp,
        (logits, [mtp logits of depth 1, .., D]).
        """
        h = tokens if tokens.is_floating_point() else self.tok_embeddings(tokens)
        positions = self.positions if positions is None else positions
        freqs_cis = self.freqs_cis if positions is None else self.freqs_cis[positions]
        routings = []
        for layer in self.layers.values():
            h, routed = layer(h, freqs_cis, document_ids=document_ids)
            if routed is not None:
                routings.append(routed)
        h = self.routing.read(h, routings) if self.routing is not None else h
        if return_mtp:
            mtp_logits = self._mtp_forward(h, tokens, freqs_cis, positions, document_ids, mtp_inputs)
        h = self.norm(h) if self.norm is not None else h
        out = self.output(h) if self.output is not None else h
        return (out, mtp_logits) if return_mtp else out

    def _mtp_forward(
        self,
        h: torch.Tensor,
        tokens: torch.Tensor,
        freqs_cis: torch.Tensor,
        positions: torch.Tensor | None,
        document_ids: torch.Tensor | None,
        mtp_inputs: torch.Tensor | None,
    ) -> list[torch.Tensor]:
        """The MTP modules in sequence from the main model's last hidden state h (before its final norm)."""
        if self.mtp is None or self.tok_embeddings is None or self.output is None:
            raise ValueError(
                f"Decoder.forward(return_mtp=True) needs Llama3Args.mtp_layers > 0 (got {self.args.mtp_layers}) and "
                "the token embedding, the MTP modules and the output head in this model part"
            )
        if mtp_inputs is None:
            if tokens.is_floating_point():
                raise ValueError(
                    "Decoder.forward(return_mtp=True) on hidden states (a pipeline stage after the first) needs "
                    "mtp_inputs, the depths' input tokens shifted from the token ids (MTP's mtp_targets)"
                )
            depths = mtp_targets(tokens, tokens, len(self.mtp), shift_document_ids(positions, document_ids))
            mtp_inputs = torch.stack([depth.inputs for depth in depths], dim=-1)
        hiddens, routings = [], []
        for module, inputs in zip(self.mtp.values(), mtp_inputs.unbind(-1), strict=True):
            h, routed = module(h, self.tok_embeddings(inputs), freqs_cis, document_ids=document_ids)
            hiddens.append(h)
            if routed is not None:
                routings.append(routed)
        if self.mtp_routing is not None:  # the modules' auxiliary loss joins the gradient through the last depth
            hiddens[-1] = self.mtp_routing.read(hiddens[-1], routings)
        return [self.output(module.shared_head.norm(h)) for module, h in zip(self.mtp.values(), hiddens, strict=True)]

    def mtp_losses(
        self,
        mtp_logits: list[torch.Tensor],
        labels: torch.Tensor,
        positions: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
        cross_entropy: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        """Each depth's cross entropy, the mean over its kept labels (mtp_targets: labels shifted k left, ignored
        where the shift leaves the row or the document), from forward(return_mtp=True)'s mtp_logits and the main
        loss's labels [bs, seqlen]. Give the positions / document_ids given to forward. The trainer weighs their
        mean by lambda (the paper's MTP loss). cross_entropy(output, labels): the mean loss of one depth's output
        (default: float32 cross entropy of logits); a chunked loss passes its own, the output then being the
        hidden states the bypassed head received."""
        depths = mtp_targets(labels, labels, len(mtp_logits), shift_document_ids(positions, document_ids))
        cross_entropy = cross_entropy or _logits_cross_entropy
        return [cross_entropy(output, depth.labels) for output, depth in zip(mtp_logits, depths, strict=True)]

    # Kept for compatibility (before 0.16 the decoder carried its routing bookkeeping itself): thin delegations
    # to `routing`, the RoutingLedger, which is what a trainer should read.

    @property
    def aux_loss(self) -> torch.Tensor | None:
        """The last forward's auxiliary loss (routing.aux_loss); None without one."""
        return self.routing.aux_loss if self.routing is not None else None

    def moe_layers(self) -> dict[str, MoE]:
        """The mixture-of-experts layers this (possibly partial) model holds, by block key (routing.layers())."""
        return self.routing.layers() if self.routing is not None else {}

    def set_loss_weight(self, weight: float) -> None:
        """routing.set_loss_weight: the gradient weight of one unit of the next forwards' training loss."""
        for ledger in (self.routing, self.mtp_routing):
            if ledger is not None:
                ledger.set_loss_weight(weight)

    def take_routing_stats(self) -> RoutingStats:
        """routing.take(): (tokens per expert [moe layers, experts] or None, aux loss sum, forwards) since the
        last call."""
        return self.routing.take() if self.routing is not None else RoutingStats(None, 0.0, 0)

    def update_expert_bias(self, load: torch.Tensor) -> None:
        """routing.update_expert_bias: auxiliary-loss-free balancing against the step's global load."""
        if self.routing is not None:
            self.routing.update_expert_bias(load)


def _logits_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), ignore_index=IGNORE_INDEX)
