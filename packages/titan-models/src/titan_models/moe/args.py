"""Shape and routing of a mixture-of-experts feed-forward layer, as data a decoder's args carry."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

LOAD_BALANCE_CHOICES = ("aux_loss", "sequence_aux_loss", "aux_loss_free", "none")


@dataclass(frozen=True)
class MoEArgs:
    """A sparse feed-forward layer: a router picks `top_k` of `num_experts` SwiGLU experts per token.

    Field names follow DeepSeek-V3 / TorchTitan; the Hugging Face name is given where it differs. GPT-OSS's
    layer is score_func="softmax", norm_topk_prob=True, router_bias=True, expert_proj_bias=True,
    expert_activation="clamped_swiglu" (swiglu_limit from its config).
    """

    num_experts: int = 8
    """Routed experts per MoE layer (HF: num_experts / n_routed_experts)."""
    top_k: int = 2
    """Experts each token is sent to (HF: num_experts_per_tok)."""
    hidden_dim: int = 256
    """SwiGLU hidden size of one routed expert (HF: moe_intermediate_size)."""
    score_func: Literal["softmax", "sigmoid"] = "softmax"
    """How router logits become scores, in fp32: softmax over experts (Qwen3-MoE) or a sigmoid per expert
    (DeepSeek-V3)."""
    norm_topk_prob: bool = False
    """Renormalise the top-k scores of a token to sum to 1 (HF: norm_topk_prob). With softmax scores this is
    GPT-OSS's routing (HF GptOssTopKRouter: top-k of the logits, then a softmax over those k only), since
    softmax(l)_i / sum_top-k softmax(l)_j = exp(l_i) / sum_top-k exp(l_j); the auxiliary losses still read the
    softmax over all experts, as HF's GPT-OSS loss does."""
    router_bias: bool = False
    """The router's linear map adds a per-expert bias to its logits (GPT-OSS: router.bias), which selects and
    weights alike (unlike aux_loss_free's bias, which only selects)."""
    routed_scaling_factor: float = 1.0
    """Multiplies the routed experts' weighted sum (DeepSeek-V3: 2.5)."""
    expert_proj_bias: bool = False
    """Each routed expert's projections add a bias, experts.w1_bias / w3_bias / w2_bias (GPT-OSS:
    gate_up_proj_bias, down_proj_bias; see GroupedExperts for the layout)."""
    expert_activation: Literal["swiglu", "clamped_swiglu"] = "swiglu"
    """The routed experts' gated unit, from gate = x w1 (+ w1_bias) and up = x w3 (+ w3_bias): "swiglu",
    silu(gate) * up; "clamped_swiglu", GPT-OSS's: gate clamped to at most swiglu_limit, up to
    [-swiglu_limit, swiglu_limit], then (up + 1) * gate * sigmoid(swiglu_alpha * gate)."""
    swiglu_alpha: float = 1.702
    """clamped_swiglu: the sigmoid's slope (HF GPT-OSS: swiglu_alpha, 1.702)."""
    swiglu_limit: float = 7.0
    """clamped_swiglu: the clamp bound (HF GPT-OSS: swiglu_limit, 7.0)."""
    num_shared_experts: int = 0
    """Experts every token goes through (DeepSeek-V3 / Qwen2-MoE style), computed as one SwiGLU of
    num_shared_experts * hidden_dim hidden units."""
    shared_expert_gate: bool = False
    """The shared experts' output is scaled per token by sigmoid(x . g), g a learned [1, dim] vector
    (shared_expert_gate.weight; Qwen2-MoE / Qwen3-Next). Needs num_shared_experts > 0."""
    num_expert_groups: int = 1
    """Group-limited routing (DeepSeek-V3; HF: n_group): the experts form this many equal groups, each scored
    by the sum of its two best selection scores; a token picks its top_k experts among the
    num_limited_groups best groups only. 1: no groups."""
    num_limited_groups: int = 1
    """Groups a token may route to (HF: topk_group)."""
    sparse_step: int = 1
    """Layer i is sparse when (i + 1) % sparse_step == 0 (HF: decoder_sparse_step)."""
    dense_layers: tuple[int, ...] = ()
    """Layers that keep a dense SwiGLU whatever sparse_step says (HF: mlp_only_layers; DeepSeek-V3's
    first_k_dense_replace = k is (0, ..., k - 1))."""
    load_balance: Literal["aux_loss", "sequence_aux_loss", "aux_loss_free", "none"] = "aux_loss"
    """How experts are kept evenly loaded: "aux_loss", the Switch-style auxiliary loss as Hugging Face
    computes it for Qwen3-MoE and GPT-OSS (token fractions times mean probabilities, over all MoE layers of a
    forward); "sequence_aux_loss", DeepSeek-V3's per-sequence auxiliary loss (summed over layers); "aux_loss_free",
    DeepSeek-V3's per-expert bias added to the scores for selection only, moved by bias_update_rate after
    each optimizer step against the load of the step; "none"."""
    aux_loss_coef: float = 0.001
    """Weight of the auxiliary loss in the training objective (HF: router_aux_loss_coef)."""
    bias_update_rate: float = 0.001
    """aux_loss_free: how far one step moves an expert's bias (DeepSeek-V3's gamma)."""

    def is_sparse(self, layer_id: int) -> bool:
        return layer_id not in self.dense_layers and (layer_id + 1) % self.sparse_step == 0

    def validate(self, owner: str = "MoEArgs") -> None:
        """Raise ValueError naming the first field that cannot build the layer."""
        for name in ("num_experts", "top_k", "hidden_dim", "sparse_step"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{owner}.{name}={value!r} must be a positive integer")
        if self.top_k > self.num_experts:
            raise ValueError(f"{owner}.top_k={self.top_k} exceeds num_experts={self.num_experts}")
        groups, limited = self.num_expert_groups, self.num_limited_groups
        if not isinstance(groups, int) or groups < 1 or self.num_experts % groups:
            raise ValueError(
                f"{owner}.num_expert_groups={groups!r} must be a positive divisor of num_experts={self.num_experts}"
            )
        if groups > 1 and self.num_experts // groups < 2:
            raise ValueError(
                f"{owner}.num_expert_groups={groups}: each group needs 2 experts (it is scored by its best two)"
            )
        if not isinstance(limited, int) or not 1 <= limited <= groups:
            raise ValueError(f"{owner}.num_limited_groups={limited!r} must be between 1 and num_expert_groups={groups}")
        if self.top_k > limited * self.num_experts // groups:
            raise ValueError(
                f"{owner}.top_k={self.top_k} exceeds the {limited * self.num_experts // groups} experts of "
                f"num_limited_groups={limited} groups; raise num_limited_groups"
            )
        if self.score_func not in ("softmax", "sigmoid"):
            raise ValueError(f"{owner}.score_func={self.score_func!r} must be 'softmax' or 'sigmoid'")
        for name in ("router_bias", "expert_proj_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{owner}.{name}={getattr(self, name)!r} must be true or false")
        if self.expert_activation not in ("swiglu", "clamped_swiglu"):
            raise ValueError(
                f"{owner}.expert_activation={self.expert_activation!r} must be 'swiglu' or 'clamped_swiglu' (GPT-OSS)"
            )
        for name, default in (("swiglu_alpha", 1.702), ("swiglu_limit", 7.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"{owner}.{name}={value!r} must be a finite number > 0 (GPT-OSS: {default})")
        if self.load_balance not in LOAD_BALANCE_CHOICES:
            raise ValueError(
                f"{owner}.load_balance={self.load_balance!r} must be one of {', '.join(LOAD_BALANCE_CHOICES)}"
            )
        if not isinstance(self.num_shared_experts, int) or self.num_shared_experts < 0:
            raise ValueError(f"{owner}.num_shared_experts={self.num_shared_experts!r} must be an integer >= 0")
        if not isinstance(self.shared_expert_gate, bool):
            raise ValueError(f"{owner}.shared_expert_gate={self.shared_expert_gate!r} must be true or false")
        if self.shared_expert_gate and not self.num_shared_experts:
            raise ValueError(f"{owner}.shared_expert_gate=True gates the shared experts, but num_shared_experts=0")
        if not self.aux_loss_coef >= 0:
            raise ValueError(f"{owner}.aux_loss_coef={self.aux_loss_coef!r} must be >= 0")
        if not self.bias_update_rate >= 0:
            raise ValueError(f"{owner}.bias_update_rate={self.bias_update_rate!r} must be >= 0")
        if not self.routed_scaling_factor > 0:
            raise ValueError(f"{owner}.routed_scaling_factor={self.routed_scaling_factor!r} must be > 0")
