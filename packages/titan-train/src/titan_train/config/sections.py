"""The training config: one dataclass per TOML section.

The string under each field is its documentation: `titan-train --help` prints it, so keep it true.
Section and key names are a public interface (users' TOML recipes and CLI overrides): extend, never rename.
"""

from dataclasses import dataclass, field
from typing import Literal

from titan_checkpoint import CheckpointConfig, check_location
from titan_float8 import Float8Options


@dataclass
class Job:
    name: str = "titan"
    """Run name, used in logs."""
    dump_folder: str = "./outputs"
    """Folder for everything the run writes: config.toml and run.json (the run's record: the config it ran with,
    its id and restarts), metrics.jsonl, checkpoints, traces."""
    description: str = ""
    """Free text describing the run."""


@dataclass
class Model:
    name: str = "llama3"
    """Model family registered in titan-models: llama3, qwen3, qwen3_moe or hyena."""
    flavor: str = "debug"
    """Size of the model within its family (llama3: tiny, tiny8, tiny-3.1, tiny-3.2, debug, 1B, 3B, 8B, 70B,
    405B; qwen3: tiny, debug, 0.6B, 1.7B, 4B, 8B, 14B, 32B; qwen3_moe: tiny, tiny-sparse2, debug, 30B-A3B,
    235B-A22B; or, for those three, hf:<folder> for the shape in a Hugging Face folder's config.json; hyena:
    tiny, debug, debug_long, 125M)."""
    n_layers: int = 0
    """Blocks of the model; 0: the flavor's. A smaller number builds the flavor's width with fewer blocks (a quick
    run at the real width; `titan-train plan` dry-runs deep models so and extrapolates per block)."""
    mtp_layers: int | Literal["auto"] = "auto"
    """Multi-token prediction modules (DeepSeek-V3's MTP, TorchTitan's num_mtp_layers): module k predicts the token
    k + 1 ahead from the previous depth's hidden state and the embedding of the token k ahead, sharing the embedding
    and output head; their loss joins the training loss weighted by training.mtp_loss_weight. 0: none. "auto": the
    flavor's: none for a named flavor; for hf:<folder>, the MTP layers its config.json declares
    (num_nextn_predict_layers) and its weights hold, loaded from the folder. On such a folder 0 drops them (logged)
    and another number is refused. Decoder families only; on every layout (FSDP/HSDP/DDP, tensor, expert, context
    and pipeline parallelism: the zero-bubble schedules are refused) and with the chunked loss (docs/training.md)."""
    tokenizer_path: str = ""
    """tokenizer.json (or a folder holding one); empty uses the tokenizer shipped with titan-train."""
    attention_mask: Literal["causal", "block_causal"] = "causal"
    """"causal": a token attends to every earlier token of its packed sequence, across document boundaries;
    "block_causal": only to earlier tokens of its own document (documents start at each BOS token the packer
    puts in; works with every parallelism, context parallel included)."""
    positions: Literal["sequence", "document"] = "sequence"
    """RoPE positions: "sequence" counts from the start of each packed sequence; "document" restarts at 0 at
    every document (each BOS token), as if each document were alone."""


@dataclass
class MoE:
    """Mixture-of-experts training choices (models with sparse layers: qwen3_moe); the routing shape is the
    flavor's."""

    load_balance: Literal["flavor", "aux_loss", "sequence_aux_loss", "aux_loss_free", "none"] = "flavor"
    """How experts are kept evenly loaded. "aux_loss": the auxiliary loss as Hugging Face computes it for
    Qwen3-MoE (token fractions x mean router probabilities, pooled over the MoE layers of each forward);
    "sequence_aux_loss": DeepSeek-V3's per-sequence auxiliary loss, summed over layers; "aux_loss_free":
    DeepSeek-V3's per-expert selection bias, moved by bias_update_rate after each optimizer step against the
    tokens each expert got over every data-parallel rank and micro-batch of the step (no loss term);
    "none"; "flavor": the flavor's choice (Qwen3-MoE: aux_loss)."""
    aux_loss_coef: float = -1.0
    """Weight of the auxiliary loss in the training objective (Hugging Face's router_aux_loss_coef); -1 keeps
    the flavor's (Qwen3-MoE: 0.001). The reported loss is the language-model loss alone; the auxiliary loss is
    reported as aux_loss."""
    bias_update_rate: float = -1.0
    """aux_loss_free: how far one step moves an expert's bias (DeepSeek-V3's gamma); -1 keeps the flavor's
    (0.001)."""


@dataclass
class Training:
    steps: int = 50
    """Number of optimizer steps to train for."""
    local_batch_size: int = 8
    """Sequences per micro-batch on each data-parallel rank."""
    global_batch_size: int = -1
    """Sequences per optimizer step over all ranks; -1 means local_batch_size x data-parallel degree.
    A multiple of that product turns on gradient accumulation."""
    seq_len: int = 256
    """Tokens per sequence."""
    max_norm: float = 1.0
    """Gradient-norm clipping threshold; 0 turns clipping off."""
    dataset: str = "kjv"
    """Dataset: "kjv" (embedded, no download), "text" (files at dataset_path: .txt or .jsonl, plain, .gz or
    .zst; .parquet; a folder of them; or a folder written by `titan-data tokenize`), "hf:<name>" (a Hugging
    Face dataset; needs the datasets package) or "chat" (conversations at dataset_path, JSONL in the Hugging
    Face messages form, rendered with the chat template of the model.tokenizer_path folder; the loss on the
    assistant's tokens only; no dataset_path: 400 example conversations shipped with titan-train;
    docs/fine-tuning.md)."""
    dataset_path: str = ""
    """Path for the "text" and "chat" datasets (file or folder)."""
    dataset_text_field: str = "text"
    """The field of a JSONL record, Parquet column or Hugging Face column that holds the document's text."""
    dataset_mixture: list[dict] = field(default_factory=list)
    """Train on several sources at once, instead of dataset / dataset_path: [{path = "a.parquet", weight = 3},
    {path = "b_tokens", weight = 1}, {dataset = "kjv", weight = 1}]. Weights are shares of documents (any
    scale); each source cycles on its own; an entry may set its own text_field. CLI: the same TOML array."""
    chat_packing: Literal["pad", "pack"] = "pad"
    """dataset = "chat": "pad", one conversation per sequence, the rest padded (ignored); "pack", as many
    whole conversations per sequence as fit, each a document of its own (needs model.attention_mask =
    "block_causal" and model.positions = "document", so that each attends only to itself)."""
    chat_overlong: Literal["truncate", "drop"] = "truncate"
    """dataset = "chat": a conversation longer than seq_len + 1 tokens is cut to its first seq_len + 1
    ("truncate") or skipped ("drop"); the count is logged at the end of each epoch."""
    dataloader_num_workers: int = 0
    """Worker processes for data loading (0 loads in the training process)."""
    data_order: Literal["global", "document_sharded"] = "global"
    """"global": one packed sequence stream for the job; each optimizer step trains on its next
    global_batch_size sequences, each data-parallel rank taking its rows, so any data-parallel degree,
    accumulation and number of workers (and a resume on another) trains on the same sequences. Every rank
    (and DataLoader worker) tokenizes every document: free for pre-tokenized data (`titan-data tokenize`).
    "document_sharded": each rank packs only its share of the documents (1/dp of the tokenization), and the
    sequences depend on the layout; for raw-text corpora too large to tokenize on every rank."""
    mixed_precision_param: Literal["float32", "bfloat16"] = "float32"
    """Dtype of the forward/backward compute: bfloat16 autocasts on one process (FSDP's param dtype once
    data parallelism shards the model); parameters and optimizer state stay float32."""
    mixed_precision_reduce: Literal["float32", "bfloat16"] = "float32"
    """Dtype of gradient reduction across data-parallel ranks (no effect on one process)."""
    seed: int = 42
    """Seed for weight init and every RNG."""
    deterministic: bool = False
    """Use deterministic algorithms only (slower; bit-reproducible runs)."""
    loss_chunk_tokens: int | Literal["auto"] = "auto"
    """> 0: compute the output projection and cross entropy this many tokens at a time, each chunk's
    gradients computed with its loss, so the logits of all tokens never exist at once (same loss and
    gradients, the same three head matmuls as the plain loss); 0: the plain loss. "auto": chunked wherever a
    micro-batch's logits are larger than the head's weight (more tokens per micro-batch than the model's dim),
    in chunks of about vocab/dim (at least 256 tokens); the log's layout line says what it chose."""
    mtp_loss_weight: float = 0.3
    """lambda: the weight of the multi-token prediction loss (the mean over depths of each depth's cross entropy) added
    to the main loss, with model.mtp_layers > 0; the step's reported loss stays the main loss, each depth's is
    logged as mtp_loss_1, mtp_loss_2, ... (DeepSeek-V3: 0.3 for the first 10T tokens, then 0.1)."""
    mtp_loss_weight_after: int = 0
    """The step after which lambda becomes training.mtp_loss_weight_late (steps 1..N use mtp_loss_weight, N+1.. the
    late weight); 0: lambda never changes."""
    mtp_loss_weight_late: float = 0.1
    """lambda after training.mtp_loss_weight_after steps."""
    loss_chunk_gradients: Literal["in_forward", "recompute"] = "in_forward"
    """How the chunked loss gets its gradients: "in_forward" (with the loss; a float32 gradient of the head's
    weight is held until backward) or "recompute" (each chunk's logits recomputed in backward: one more head
    matmul, nothing held)."""


@dataclass
class Optimizer:
    name: Literal["AdamW", "Muon"] = "AdamW"
    """Optimizer. "Muon": Muon (momentum orthogonalized by Newton-Schulz, as torch.optim.Muon) for the hidden
    matrices and expert weights, AdamW (lr, beta1, beta2, eps, weight_decay) for every other parameter."""
    lr: float = 8e-4
    """Peak learning rate (reached at the end of warmup); with Muon, AdamW's."""
    beta1: float = 0.9
    """Adam beta1."""
    beta2: float = 0.95
    """Adam beta2."""
    eps: float = 1e-8
    """Adam epsilon."""
    weight_decay: float = 0.1
    """Decoupled weight decay; with Muon, AdamW's."""
    implementation: Literal["auto", "foreach", "fused", "for-loop"] = "auto"
    """Kernel: fused where the device supports it, foreach otherwise ("auto"), or forced (AdamW's kernels)."""
    muon_lr: float = 0.02
    """Muon: peak learning rate of the Muon parameters (the schedule scales it as it scales lr), before the
    muon_adjust_lr_fn scaling."""
    muon_weight_decay: float = 0.1
    """Muon: decoupled weight decay of the Muon parameters (p *= 1 - muon_lr x muon_weight_decay each step)."""
    muon_momentum: float = 0.95
    """Muon: momentum of the gradient average that is orthogonalized."""
    muon_nesterov: bool = True
    """Muon: orthogonalize the Nesterov look-ahead (gradient + momentum x average) rather than the average."""
    muon_ns_steps: int = 5
    """Muon: Newton-Schulz iterations (Keller Jordan's quintic, torch's coefficients), 1 to 99."""
    muon_adjust_lr_fn: Literal["original", "match_rms_adamw"] = "original"
    """Muon: learning-rate scaling per matrix shape (rows x cols): "original" muon_lr x sqrt(max(1, rows/cols));
    "match_rms_adamw" muon_lr x 0.2 x sqrt(max(rows, cols)) (updates of AdamW's size: set muon_lr = lr)."""
    muon_ns_dtype: Literal["bfloat16", "float32"] = "bfloat16"
    """Muon: dtype of the Newton-Schulz iteration. bfloat16 (torch's): fast, and the iteration tolerates its
    rounding; float32: exact to float32, so layouts match a single process to float32 tolerance."""
    adamw_params: list[str] = field(default_factory=list)
    """Muon: name patterns of the parameters AdamW updates (fnmatch globs, each matched against every dotted
    part of a parameter's name and against the whole name). Empty: the model plan's rule (ModelPlan.adamw_params,
    per family: embeddings, output head, norms, biases, routers and gates, convolutions, Hyena's filters;
    docs/optimizers.md). Tensors of one dimension, or more than three, always go
    to AdamW. The split is logged at startup."""
    muon_clip_threshold: float = 0.0
    """Muon: MuonClip's QK-clip (Kimi K2) threshold tau on attention logits; 0 turns it off. After each step, a
    head whose largest logit of the step (q . k x softmax scale, over the pairs it attended) passed tau has its
    query and key projections rescaled so that its logits scale by tau / that logit. Reported per layer as
    max_logit/layer_<i> and over all as max_logit. Kimi K2 used 100."""


@dataclass
class LRScheduler:
    warmup_steps: int = 10
    """Steps of linear warmup from lr/(warmup_steps+1) to lr."""
    decay_type: Literal["linear", "cosine", "sqrt", "constant"] = "linear"
    """Shape of the decay after warmup."""
    decay_ratio: float = 1.0
    """Fraction of the steps after warmup that decay (the rest hold lr constant first, WSD-style)."""
    min_lr_factor: float = 0.0
    """Floor of the decay, as a fraction of lr."""


@dataclass
class Parallelism:
    data_parallel_replicate_degree: int = 1
    """Replicas of the model (DDP, or the replicate dimension of HSDP)."""
    data_parallel_shard_degree: int = -1
    """Ranks the model is sharded over by FSDP; -1 takes the world size left by the other degrees."""
    tensor_parallel_degree: int = 1
    """Ranks each layer's matmuls are split over (tensor + sequence parallel)."""
    enable_loss_parallel: bool = True
    """With tensor parallel, compute the loss on vocab-sharded logits (no all-gather of logits)."""
    enable_async_tensor_parallel: bool = False
    """With tensor parallel: overlap the sequence-parallel all-gathers and reduce-scatters with the matmuls,
    in chunks (micro-pipelined TP; same results). No effect without tensor parallel."""
    async_tensor_parallel_implementation: Literal["auto", "titan", "symmetric_memory"] = "auto"
    """"titan": eager chunked collectives, any device; "symmetric_memory": torch's inductor pass (CUDA,
    compile.enable with the inductor backend, the TP group on one node); "auto": symmetric_memory where it
    can run, else titan."""
    pipeline_parallel_degree: int = 1
    """Pipeline stages over ranks."""
    pipeline_parallel_schedule: str = "1F1B"
    """Pipeline schedule: GPipe, 1F1B, Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble or DualPipeV
    (the last four run several stages per rank; ZBVZeroBubble and DualPipeV exactly two, V-shaped)."""
    pipeline_parallel_microbatch_size: int = 1
    """Sequences per pipeline micro-batch; training.local_batch_size must divide by it."""
    pipeline_parallel_layers_per_stage: int = 0
    """Blocks per stage, counting the embedding and the output as one block each: sets the number of
    stages (a multiple of pipeline_parallel_degree). 0: one stage per rank, two for multi-stage schedules."""
    pipeline_parallel_stage_blocks: list[str] = field(default_factory=list)
    """An explicit split, one entry per stage, each the stage's block names separated by spaces, e.g.
    ["layers.0", "layers.1 layers.2 layers.3"] (CLI: comma between stages). Empty: split automatically,
    giving the first and last stage fewer blocks for the embedding and the output."""
    context_parallel_degree: int = 1
    """Ranks the sequence is split over (ring attention; training.seq_len must divide by 2 x this degree)."""
    context_parallel_variant: Literal["p2p", "allgather"] = "p2p"
    """How ring attention moves K/V: "p2p" passes blocks around the ring, overlapping the next transfer with
    the current block's compute; "allgather" gathers all K/V blocks at once (more memory, fewer messages)."""
    context_parallel_implementation: Literal["titan", "torch"] = "titan"
    """"titan": Titan's ring attention (CPU and CUDA); "torch": torch's experimental context_parallel
    (CUDA only)."""
    expert_parallel_degree: int = 1
    """Ranks the routed experts of a mixture of experts are split over (each holds num_experts / this many;
    their tokens move there and back by all-to-all). Taken from the data-parallel x context-parallel ranks,
    context ranks first: it divides data_parallel_shard_degree x context_parallel_degree and is a multiple of
    context_parallel_degree. The experts are FSDP-sharded over the data ranks left. Needs FSDP2 and
    tensor_parallel_degree = 1."""
    fsdp_reshard_after_forward: Literal["default", "always", "never"] = "default"
    """Free gathered parameters after forward and gather them again in backward ("default": yes, except the
    root module, and except with pipeline parallelism; with simple_fsdp "default" is "always")."""
    fsdp_implementation: Literal["fsdp2", "simple_fsdp"] = "fsdp2"
    """Implementation of data parallelism: "fsdp2" (fully_shard; DDP when only replicated) or "simple_fsdp"
    (parameters as DTensors gathered by a parametrization, so torch.compile traces the collectives; it also
    does the replicate-only and hybrid layouts)."""
    simple_fsdp_overlap: Literal["none", "bucket", "bucket_reorder", "auto", "manual"] = "none"
    """With simple_fsdp and compile (backend inductor): "bucket" merges each block's all-gathers and
    reduce-scatters; "bucket_reorder" also moves them to overlap compute; "auto" (inductor's overlap
    scheduler) and "manual" (simple_fsdp_manual_buckets) need a CUDA GPU."""
    simple_fsdp_manual_buckets: list[str] = field(default_factory=list)
    """With simple_fsdp_overlap = "manual": module names within a block, one bucket each, e.g.
    ["attention", "feed_forward"]."""


@dataclass
class ActivationCheckpointConfig:
    mode: Literal["none", "selective", "full", "auto"] = "none"
    """Recompute activations in backward instead of keeping them: none, selective, full (every block), or
    auto (per block the least recompute whose predicted peak fits memory_budget_gib)."""
    selective_ac_option: str = "op"
    """With mode = "selective": "op" keeps matmul/attention outputs and recomputes the cheap ops in between;
    an integer N checkpoints every Nth block."""
    memory_budget_gib: float = 0.0
    """With mode = "auto": the per-rank peak to fit (parameters, AdamW state, the step's tensors) in GiB;
    0 means the GPU's capacity (a budget is needed on CPU)."""


@dataclass
class Compile:
    enable: bool = False
    """Compile each repeated block with torch.compile (regional compilation)."""
    backend: Literal["inductor", "aot_eager", "eager"] = "inductor"
    """torch.compile backend (inductor generates kernels; aot_eager only traces, for debugging)."""


@dataclass
class Checkpoint(CheckpointConfig):
    """[checkpoint]: titan-checkpoint's options (interval, keep_latest_k, async_mode, load_step, ...) plus
    where the trainer puts checkpoints and what it does with them."""

    enable: bool = False
    """Save checkpoints and resume from the latest complete one in the folder."""
    folder: str = "checkpoint"
    """Checkpoint folder, relative to job.dump_folder (or absolute), or an object-store URL
    (s3://bucket/prefix; needs titan-checkpoint[s3], credentials and endpoint as s3fs takes them)."""
    export_safetensors: bool = False
    """At the end of training, also write the model in Hugging Face layout (safetensors + config.json +
    tokenizer) to export_folder, in export_dtype."""
    export_folder: str = "hf"
    """Where export_safetensors writes, relative to job.dump_folder (or absolute), or an object-store URL."""
    create_seed_checkpoint: bool = False
    """Write the initialized weights as step 0 of the checkpoint folder and exit (one process): every parallel
    layout can then start from the same weights."""

    def validate(self) -> None:
        super().validate()
        for key in ("folder", "export_folder"):
            check_location(getattr(self, key), f"checkpoint.{key}")
        if self.export_safetensors and not self.enable:
            raise ValueError(
                "checkpoint.export_safetensors=true exports the run's last checkpoint, but checkpoint.enable=false "
                "writes none; set checkpoint.enable=true (or checkpoint.export_safetensors=false)"
            )


@dataclass
class Float8(Float8Options):
    """[float8]: float8 training via torchao (titan-float8's options)."""


@dataclass
class Metrics:
    log_freq: int = 10
    """Steps between metric lines (the first and last step are always logged)."""
    ranks: list[int] = field(default_factory=lambda: [0])
    """Ranks that print the metric line (and write TensorBoard events); metrics.jsonl is written by rank 0."""
    enable_tensorboard: bool = False
    """Write every logged metric as a TensorBoard scalar under <dump_folder>/tb/<job.name>/rank<R>
    (view with: tensorboard --logdir <dump_folder>/tb)."""
    enable_wandb: bool = False
    """Also log every metric to Weights & Biases, from rank 0 (needs `pip install 'titan-debug[wandb]'`): one W&B
    run per training run, its id the run id in <dump_folder>/run.json (a resumed run continues it), its files
    under <dump_folder>/wandb."""
    wandb_project: str = "titan"
    """W&B project the run is logged to."""
    wandb_mode: Literal["online", "offline"] = "online"
    """"online" streams to the W&B server (after `wandb login`, or with WANDB_API_KEY set); "offline" writes
    only to <dump_folder>/wandb (upload later with `wandb sync`)."""


@dataclass
class Profiling:
    enable_profiling: bool = False
    """Write torch.profiler traces to <dump_folder>/profile_traces/iteration_<N>/rank<R>_trace.json."""
    profile_freq: int = 10
    """Steps between traces; each trace holds the profile_active steps ending at a multiple of this."""
    profile_warmup: int = 3
    """Steps before each traced window that warm the profiler up (profile_warmup + profile_active <= profile_freq)."""
    profile_active: int = 1
    """Steps recorded per trace."""
    enable_memory_snapshot: bool = False
    """Dump the CUDA allocator history to <dump_folder>/memory_snapshot/ every memory_snapshot_freq steps and on
    out-of-memory (CUDA only; elsewhere it warns and does nothing)."""
    memory_snapshot_freq: int = 10
    """Steps between memory snapshots."""


@dataclass
class Comm:
    init_timeout_seconds: int = 300
    """Collective timeout until the first step completes (init, checkpoint load, compile)."""
    train_timeout_seconds: int = 100
    """Collective timeout from the second step on: how long a hang lasts before the run fails and dumps."""
    trace_buf_size: int = 20000
    """Collectives the flight recorder keeps per rank (0 = off); dumped to <dump_folder>/comm_traces when a
    collective fails or times out (summarize with tools/flight_recorder_summary.py)."""


@dataclass
class Debug:
    nan_policy: Literal["stop", "skip"] = "stop"
    """On a NaN/inf loss or grad norm: stop the run before the optimizer step (no checkpoint is written for
    that step or later), or skip that step's update and continue."""


@dataclass
class Validation:
    enable: bool = False
    """Every `freq` steps, evaluate the loss on a held-out dataset, forward only, on the training layout."""
    dataset: str = "kjv_validation"
    """Dataset evaluated, named as training.dataset: "kjv_validation" (the chapters of the embedded corpus
    that "kjv" leaves out), "text" (with validation.dataset_path) or "hf:<name>"."""
    dataset_path: str = ""
    """Path for the "text" and "chat" datasets (file or folder)."""
    local_batch_size: int = -1
    """Sequences per batch on each data-parallel rank; -1: training.local_batch_size (which it must be with
    pipeline parallelism)."""
    seq_len: int = -1
    """Tokens per sequence; -1: training.seq_len (which it must be with context parallelism)."""
    freq: int = 10
    """Steps between evaluations (also after the last step)."""
    steps: int = -1
    """Global batches per evaluation, as training counts steps (local_batch_size x data-parallel degree x
    accumulation sequences, the same on every layout); -1 evaluates the whole dataset once (to its last full
    global batch). Each evaluation sees the same batches."""


@dataclass
class FaultTolerance:
    """Replica groups with torchft (`pip install 'titan-train[ft]'`): `group_size` copies of this job, each an
    ordinary Titan job of its own (FSDP, TP, PP inside it) launched by its own torchrun, that average gradients
    over the live groups each step. A group that dies does not stop the others; restarted, it heals from a live
    one. Keys as TorchTitan's [fault_tolerance]."""

    enable: bool = False
    """Join the replica groups of `torchft_lighthouse` (its address: lighthouse_address or TORCHFT_LIGHTHOUSE)."""
    replica_id: int = 0
    """This group's id, 0 .. group_size - 1: it picks the group's share of each global batch. Group 0, while
    live (else the lowest live id), writes the checkpoints."""
    group_size: int = 0
    """Replica groups in the job when all are live. training.global_batch_size is the whole job's: each group
    trains global_batch_size / group_size sequences per step."""
    min_replica_size: int = 1
    """Fewest live groups a step commits with; with fewer, the live ones wait (the lighthouse's quorum)."""
    lighthouse_address: str = ""
    """http://host:port of torchft_lighthouse; empty: the TORCHFT_LIGHTHOUSE environment variable."""
    semi_sync_method: Literal["none", "local_sgd", "diloco"] = "none"
    """"none": gradients averaged over the live groups every step. "local_sgd": each group steps on its own and
    the parameters are averaged every sync_steps. "diloco": every sync_steps the averaged parameter change is
    applied by an outer SGD optimizer (outer_lr, outer_momentum, Nesterov)."""
    sync_steps: int = 5
    """Steps between synchronisations of local_sgd / diloco."""
    outer_lr: float = 0.7
    """diloco: the outer optimizer's learning rate (DiLoCo's 0.7)."""
    outer_momentum: float = 0.9
    """diloco: the outer optimizer's Nesterov momentum."""
    timeout_seconds: int = 60
    """How long a quorum or a cross-group collective may take before the step is given up (and redone by the
    live groups)."""


@dataclass
class DryRun:
    """[dry_run]: what `--dry-run` models, so a recipe measured on some GPU is predicted on that GPU."""

    gpu: str = ""
    """The GPU whose step time and memory the dry run predicts, by name (`titan-train --dry-run --help` lists
    them, e.g. "h100-sxm-96gb-500w", the TorchTitan paper's); empty: the default, h100-sxm-80gb. `--gpu NAME`
    on the command line wins over it."""


@dataclass
class Lora:
    """[lora]: low-rank adapters (LoRA) trained on a frozen base, exported in peft's layout (docs/lora.md). The
    base comes from checkpoint.initial_load_path (a checkpoint without adapters, or a Hugging Face folder);
    checkpoint.export_safetensors writes the merged model and, beside it (`<export_folder>-peft`), the adapters."""

    enable: bool = False
    """Freeze the model and train adapters on the layers target_modules names: y = W x + B A x * alpha / rank."""
    rank: int = 8
    """Rank r of each adapter: A is r x in_features, B is out_features x r."""
    alpha: float = 16.0
    """Scale of the adapters' output: alpha / rank (peft's lora_alpha)."""
    dropout: float = 0.0
    """Dropout on the adapters' input (peft's lora_dropout); 0 for none."""
    target_modules: list[str] = field(default_factory=lambda: ["wq", "wk", "wv", "wo"])
    """Linear layers to adapt, by last name (wq, wk, wv, wo, w1, w2, w3, output) or whole name with wildcards
    (layers.*.attention.wq)."""
    initial_adapter_path: str = ""
    """A peft adapter folder (adapter_config.json + adapter_model.safetensors) whose adapters a fresh run starts
    from instead of new ones, to continue training it; its r, lora_alpha and target modules must equal rank,
    alpha and target_modules. A resume takes the run's own checkpoint instead. Needs checkpoint.enable."""


@dataclass
class JobConfig:
    job: Job = field(default_factory=Job)
    model: Model = field(default_factory=Model)
    moe: MoE = field(default_factory=MoE)
    training: Training = field(default_factory=Training)
    optimizer: Optimizer = field(default_factory=Optimizer)
    lr_scheduler: LRScheduler = field(default_factory=LRScheduler)
    parallelism: Parallelism = field(default_factory=Parallelism)
    activation_checkpoint: ActivationCheckpointConfig = field(default_factory=ActivationCheckpointConfig)
    compile: Compile = field(default_factory=Compile)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    float8: Float8 = field(default_factory=Float8)
    metrics: Metrics = field(default_factory=Metrics)
    profiling: Profiling = field(default_factory=Profiling)
    comm: Comm = field(default_factory=Comm)
    debug: Debug = field(default_factory=Debug)
    validation: Validation = field(default_factory=Validation)
    fault_tolerance: FaultTolerance = field(default_factory=FaultTolerance)
    dry_run: DryRun = field(default_factory=DryRun)
    lora: Lora = field(default_factory=Lora)
