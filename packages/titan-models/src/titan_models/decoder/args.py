"""The decoder's hyperparameters: one dataclass, validated before any module is built. Every family built on
the decoder (Llama 3, Qwen3, Qwen3-MoE, DeepSeek-V3) is a set of these args."""

from __future__ import annotations

from dataclasses import dataclass

from titan_models.decoder.attention_kernels import KERNELS as ATTENTION_KERNELS
from titan_models.decoder.mla_args import MLAArgs
from titan_models.decoder.rope import RopeScaling, YarnScaling
from titan_models.linear_attention.args import GatedDeltaNetArgs
from titan_models.moe.args import MoEArgs

LAYER_TYPES = ("full_attention", "sliding_attention", "linear_attention")
"""Hugging Face's names for a layer's token mixer, as DecoderArgs.layer_types holds them: softmax attention over the
whole causal past or a sliding window, or linear attention (Gated DeltaNet, args.linear_attention)."""


@dataclass
class DecoderArgs:
    """Shape of a decoder: Llama 3's, and the variations the other families declare as data (Qwen3: per-head
    q/k norm and its own head width; Qwen3-MoE: sparse feed-forward layers; DeepSeek-V3: multi-head latent
    attention, YaRN and a DeepSeek MoE; GPT-OSS: attention sinks, sliding windows per layer, projection biases;
    Qwen3-Next: linear-attention layers, gated attention output, partial RoPE, zero-centred norms, a gated shared
    expert).
    Field names follow Meta's reference and TorchTitan, and Hugging Face's where those have none.

    Published as `Llama3Args` too (titan_models.llama3), the name flavor tables and checkpoints' configs
    use; so its errors name it `Llama3Args.<field>`."""

    dim: int = 4096
    """Width of the residual stream (hidden size)."""
    n_layers: int = 32
    """Number of transformer blocks."""
    n_heads: int = 32
    """Number of query heads; head_dim = dim // n_heads."""
    n_kv_heads: int | None = None
    """Number of key/value heads (grouped-query attention); None means n_heads (plain multi-head)."""
    vocab_size: int = 128256
    """Rows of the token embedding and of the output projection."""
    multiple_of: int = 256
    """The SwiGLU hidden size is rounded up to a multiple of this (hardware-friendly shapes)."""
    ffn_dim_multiplier: float | None = None
    """Scales the SwiGLU hidden size int(8 * dim / 3) before rounding; None means 1."""
    ffn_hidden_dim: int | None = None
    """Explicit SwiGLU hidden size, overriding multiple_of / ffn_dim_multiplier (set when importing a
    Hugging Face config, which stores only the resulting intermediate_size)."""
    norm_eps: float = 1e-5
    """Epsilon inside RMSNorm."""
    rope_theta: float = 500000.0
    """RoPE base: the angle of pair i at position p is p * rope_theta ** (-2i / head_dim)."""
    rope_scaling: RopeScaling | YarnScaling | None = None
    """Llama 3.1 long-context frequency scaling, or YaRN's (DeepSeek-V3); None for plain RoPE."""
    max_seq_len: int = 2048
    """Length of the precomputed RoPE table; positions must be smaller than this."""
    tie_word_embeddings: bool = False
    """The output projection reuses the token embedding matrix (Llama 3.2 1B / 3B): one parameter, read
    by both, its gradient the sum of both uses."""
    attention_head_dim: int | None = None
    """Width of each attention head; None means dim // n_heads (Llama 3). Qwen3 sets it on its own (e.g. 128
    with dim 1024 and 16 heads)."""
    qk_norm: bool = False
    """RMSNorm over each head's query and key, before RoPE (Qwen3)."""
    mla: MLAArgs | None = None
    """Multi-head latent attention (DeepSeek-V2 / V3) instead of grouped-query attention; n_kv_heads,
    attention_head_dim and qk_norm then do not apply."""
    moe: MoEArgs | None = None
    """Mixture-of-experts feed-forward layers (which ones: moe.sparse_step and moe.dense_layers); None: every
    layer is a dense SwiGLU."""
    depth_init: bool = True
    """If True the output projections of block i use std 0.02 / sqrt(2 * (i + 1)); if False every block
    uses 0.02 / sqrt(2 * n_layers). Both keep the residual stream's variance from growing with depth."""
    mtp_layers: int = 0
    """Multi-token prediction modules after the main decoder (DeepSeek-V3; TorchTitan's num_mtp_layers): module k
    predicts the token k + 1 positions after the next (decoder/mtp.py). 0: none, the model unchanged."""
    attention_bias: bool = False
    """Biases on the query, key, value and output projections (GPT-OSS; Hugging Face's attention_bias).
    Initialized to zero."""
    attention_sinks: bool = False
    """A learned logit per query head (attention.sinks [n_heads]) in the softmax denominator, as if every query
    also saw one key of that score and a zero value: a head may attend to nothing (GPT-OSS). Initialized normal
    with std 0.02."""
    sliding_window: int | None = None
    """Keys a query in a sliding layer sees, itself included: key j is kept when i - j < sliding_window (Hugging
    Face's convention). Which layers slide: layer_types. None: no window anywhere."""
    layer_types: list[str] | None = None
    """Each layer's attention as Hugging Face writes it, one entry per layer: "full_attention" or
    "sliding_attention" (GPT-OSS alternates them, starting with sliding), or "linear_attention" (Qwen3-Next: a Gated
    DeltaNet of shape args.linear_attention instead of softmax attention). None: every layer slides when
    sliding_window is set (Mistral), else every layer is full."""
    linear_attention: GatedDeltaNetArgs | None = None
    """Shape of the Gated DeltaNet of the layers layer_types marks "linear_attention" (Qwen3-Next); its dim must be
    this dim. None: no linear-attention layer."""
    attention_output_gate: bool = False
    """Gated attention (Qwen3-Next): wq also emits a gate per query channel, and the attention output is multiplied
    by sigmoid(gate) before wo. wq's rows per head are [query (head_dim) | gate (head_dim)], Hugging Face's q_proj
    layout, so a split by heads keeps each head's gate with its query."""
    partial_rotary_factor: float = 1.0
    """Fraction of each query/key head RoPE rotates: the first int(head_dim * factor) channels, the rest pass
    unrotated (Qwen3-Next: 0.25; Hugging Face's rope_parameters.partial_rotary_factor). 1: the whole head."""
    zero_centered_norm: bool = False
    """Every RMSNorm of the decoder (blocks, final, q/k) scales by (1 + weight), its weight initialized at 0, so
    weight decay pulls the scale toward 1, not 0 (Qwen3-Next's Qwen3NextRMSNorm). The linear-attention output norm
    keeps its plain weight."""
    attention_kernel: str = "auto"
    """The kernel for attention with sinks or a window: "auto" (SDPA without sinks, FlexAttention on CUDA,
    otherwise the exact eager fallback; see decoder/attention_kernels.py), or "sdpa", "flex" or "eager" forced.
    Plain causal attention is always one SDPA call."""

    @property
    def head_dim(self) -> int:
        return self.attention_head_dim or self.dim // self.n_heads

    @property
    def rope_head_dim(self) -> int:
        """Width of the part of a head RoPE rotates: the whole head, its first partial_rotary_factor of it, or MLA's
        rotary part."""
        if self.mla is not None:
            return self.mla.qk_rope_head_dim
        return int(self.head_dim * self.partial_rotary_factor)

    def is_linear_attention(self, layer_id: int) -> bool:
        """Whether block `layer_id` mixes tokens with linear attention (a Gated DeltaNet), not softmax attention."""
        return self.layer_types is not None and self.layer_types[layer_id] == "linear_attention"

    def is_sparse(self, layer_id: int) -> bool:
        """Whether block `layer_id` holds a mixture of experts instead of a dense SwiGLU."""
        return self.moe is not None and self.moe.is_sparse(layer_id)

    def window_for(self, layer_id: int) -> int | None:
        """The sliding window of block `layer_id`, or None where it attends to its whole causal past."""
        if self.sliding_window is None:
            return None
        if self.layer_types is None or self.layer_types[layer_id] == "sliding_attention":
            return self.sliding_window
        return None

    @property
    def num_kv_heads(self) -> int:
        """n_kv_heads, or n_heads when n_kv_heads is None."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def hidden_dim(self) -> int:
        """SwiGLU hidden size. 8 * dim / 3 keeps the parameter count of a 4 * dim two-matrix MLP
        with three matrices (Shazeer, "GLU Variants Improve Transformer")."""
        if self.ffn_hidden_dim is not None:
            return self.ffn_hidden_dim
        hidden = int(2 * (4 * self.dim) / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)

    def validate(self) -> None:
        """Raise ValueError naming the first field that cannot build a model."""
        if not isinstance(self.mtp_layers, int) or isinstance(self.mtp_layers, bool) or self.mtp_layers < 0:
            raise ValueError(f"Llama3Args.mtp_layers={self.mtp_layers!r} must be an integer >= 0 (0: no MTP modules)")
        for name in ("dim", "n_layers", "n_heads", "vocab_size", "multiple_of", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"Llama3Args.{name}={value!r} must be a positive integer")
        if self.n_kv_heads is not None and (
            not isinstance(self.n_kv_heads, int) or isinstance(self.n_kv_heads, bool) or self.n_kv_heads <= 0
        ):
            raise ValueError(
                f"Llama3Args.n_kv_heads={self.n_kv_heads!r} must be a positive integer or None (= n_heads)"
            )
        if self.attention_head_dim is not None and (
            not isinstance(self.attention_head_dim, int) or self.attention_head_dim <= 0
        ):
            raise ValueError(
                f"Llama3Args.attention_head_dim={self.attention_head_dim!r} must be a positive integer or None"
            )
        if self.attention_head_dim is None and self.dim % self.n_heads:
            raise ValueError(
                f"Llama3Args.dim={self.dim} is not divisible by n_heads={self.n_heads}; dim must be n_heads * head_dim"
            )
        if self.head_dim % 2:
            raise ValueError(
                f"Llama3Args.dim={self.dim} with n_heads={self.n_heads} gives an odd "
                f"head_dim={self.head_dim}; RoPE rotates pairs, so head_dim must be even"
            )
        if self.n_heads % self.num_kv_heads:
            raise ValueError(
                f"Llama3Args.n_heads={self.n_heads} is not divisible by n_kv_heads={self.num_kv_heads}; "
                f"each key/value head must serve the same number of query heads"
            )
        self._validate_attention_variations()
        if self.mla is not None:
            if not isinstance(self.mla, MLAArgs):
                raise ValueError(f"Llama3Args.mla={self.mla!r} must be an MLAArgs or None")
            self.mla.validate("Llama3Args.mla")
        if self.moe is not None:
            if not isinstance(self.moe, MoEArgs):
                raise ValueError(f"Llama3Args.moe={self.moe!r} must be a MoEArgs or None")
            self.moe.validate("Llama3Args.moe")
        if not isinstance(self.tie_word_embeddings, bool):
            raise ValueError(f"Llama3Args.tie_word_embeddings={self.tie_word_embeddings!r} must be true or false")
        if self.ffn_dim_multiplier is not None and not self.ffn_dim_multiplier > 0:
            raise ValueError(f"Llama3Args.ffn_dim_multiplier={self.ffn_dim_multiplier!r} must be > 0 or None")
        if self.ffn_hidden_dim is not None and (not isinstance(self.ffn_hidden_dim, int) or self.ffn_hidden_dim <= 0):
            raise ValueError(f"Llama3Args.ffn_hidden_dim={self.ffn_hidden_dim!r} must be a positive integer or None")
        if not self.norm_eps > 0:
            raise ValueError(f"Llama3Args.norm_eps={self.norm_eps!r} must be > 0")
        if not self.rope_theta > 0:
            raise ValueError(f"Llama3Args.rope_theta={self.rope_theta!r} must be > 0")
        scaling = self.rope_scaling
        if isinstance(scaling, YarnScaling):
            if not scaling.factor > 0 or scaling.original_max_position_embeddings <= 0:
                raise ValueError(
                    f"Llama3Args.rope_scaling={scaling}: factor and original_max_position_embeddings must be > 0"
                )
            if not scaling.beta_fast > scaling.beta_slow > 0:
                raise ValueError(f"Llama3Args.rope_scaling={scaling}: need beta_fast > beta_slow > 0")
        elif scaling is not None:
            if not isinstance(scaling, RopeScaling):
                raise ValueError(f"Llama3Args.rope_scaling={scaling!r} must be a RopeScaling, a YarnScaling or None")
            if not scaling.factor > 0:
                raise ValueError(f"Llama3Args.rope_scaling.factor={scaling.factor!r} must be > 0")
            if not 0 < scaling.low_freq_factor < scaling.high_freq_factor:
                raise ValueError(
                    f"Llama3Args.rope_scaling: need 0 < low_freq_factor < high_freq_factor, got "
                    f"low_freq_factor={scaling.low_freq_factor}, high_freq_factor={scaling.high_freq_factor}"
                )
            if scaling.original_max_position_embeddings <= 0:
                raise ValueError(
                    f"Llama3Args.rope_scaling.original_max_position_embeddings="
                    f"{scaling.original_max_position_embeddings!r} must be > 0"
                )

    def _validate_attention_variations(self) -> None:
        for name in ("attention_bias", "attention_sinks"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Llama3Args.{name}={getattr(self, name)!r} must be true or false")
        window = self.sliding_window
        if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window <= 0):
            raise ValueError(
                f"Llama3Args.sliding_window={window!r} must be a positive integer (keys a query sees, itself "
                "included) or None (no window)"
            )
        if self.layer_types is not None:
            types = self.layer_types
            if not isinstance(types, (list, tuple)) or len(types) != self.n_layers:
                count = f"has {len(types)} entries" if isinstance(types, (list, tuple)) else f"={types!r} is not a list"
                raise ValueError(
                    f"Llama3Args.layer_types {count} but n_layers={self.n_layers}; give one entry per layer, each "
                    f"one of {LAYER_TYPES}, or None"
                )
            for i, kind in enumerate(types):
                if kind not in LAYER_TYPES:
                    raise ValueError(f"Llama3Args.layer_types[{i}]={kind!r} is not one of {LAYER_TYPES}")
            if "sliding_attention" in types and window is None:
                raise ValueError(
                    f"Llama3Args.layer_types[{list(types).index('sliding_attention')}]='sliding_attention' needs "
                    "Llama3Args.sliding_window, which is None; set the window or make the layer 'full_attention'"
                )
        self._validate_qwen3_next_variations()
        if self.attention_kernel not in ATTENTION_KERNELS:
            raise ValueError(f"Llama3Args.attention_kernel={self.attention_kernel!r} is not one of {ATTENTION_KERNELS}")
        if self.mla is not None:
            for name in ("attention_bias", "attention_sinks", "sliding_window"):
                if getattr(self, name):
                    raise ValueError(
                        f"Llama3Args.{name}={getattr(self, name)!r} applies to grouped-query attention only, and "
                        "Llama3Args.mla is set; unset one of them"
                    )

    def _validate_qwen3_next_variations(self) -> None:
        for name in ("attention_output_gate", "zero_centered_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Llama3Args.{name}={getattr(self, name)!r} must be true or false")
        factor = self.partial_rotary_factor
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
            raise ValueError(f"Llama3Args.partial_rotary_factor={factor!r} must be in (0, 1] (1: rotate whole heads)")
        if factor != 1 and self.mla is not None:
            raise ValueError(
                f"Llama3Args.partial_rotary_factor={factor} applies to grouped-query attention; with Llama3Args.mla "
                "the rotary part is mla.qk_rope_head_dim"
            )
        if self.mla is None and (self.rope_head_dim < 2 or self.rope_head_dim % 2):
            raise ValueError(
                f"Llama3Args.partial_rotary_factor={factor} rotates {self.rope_head_dim} of head_dim={self.head_dim} "
                "channels; RoPE rotates pairs, so that must be a positive even number"
            )
        linear = self.linear_attention
        uses_linear = self.layer_types is not None and "linear_attention" in self.layer_types
        if uses_linear and linear is None:
            layer = list(self.layer_types).index("linear_attention")
            raise ValueError(
                f"Llama3Args.layer_types[{layer}]='linear_attention' needs Llama3Args.linear_attention (a "
                "GatedDeltaNetArgs), which is None; set it or make the layer 'full_attention'"
            )
        if linear is not None:
            if not isinstance(linear, GatedDeltaNetArgs):
                raise ValueError(f"Llama3Args.linear_attention={linear!r} must be a GatedDeltaNetArgs or None")
            if linear.dim != self.dim:
                raise ValueError(
                    f"Llama3Args.linear_attention.dim={linear.dim} differs from Llama3Args.dim={self.dim}; the Gated "
                    "DeltaNet reads and writes the residual stream, so set them equal"
                )
        if self.mtp_layers and (uses_linear or self.zero_centered_norm):
            raise ValueError(
                f"Llama3Args.mtp_layers={self.mtp_layers}: multi-token prediction modules are not built for "
                "linear-attention layers or zero-centred norms yet (Qwen3-Next's MTP); set mtp_layers = 0"
            )
