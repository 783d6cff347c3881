"""A toy language model, its Hugging Face adapter and a toy stateful data source, for the tests.

The adapter renames every tensor and reorders the rows of w_in (as Llama's q/k permutation does), so a
round trip only passes if both directions are applied.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from types import SimpleNamespace

import torch
from torch import nn

from titan_checkpoint import CheckpointConfig, CheckpointManager, ModelState, OptimizerState, RankLocal


@dataclass
class ToyArgs:
    vocab_size: int = 32
    dim: int = 16
    n_layers: int = 2


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.Parameter(torch.ones(dim))
        self.w_in = nn.Linear(dim, 2 * dim, bias=False)
        self.w_out = nn.Linear(2 * dim, dim, bias=False)
        self.dropout = nn.Dropout(0.1)  # uses the global RNG: exact resume needs the RNG restored

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.norm
        return x + self.dropout(self.w_out(torch.relu(self.w_in(h))))


class ToyLM(nn.Module):
    def __init__(self, args: ToyArgs):
        super().__init__()
        self.args = args
        self.tok = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict({str(i): Block(args.dim) for i in range(args.n_layers)})
        self.out = nn.Linear(args.dim, args.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok(tokens)
        for layer in self.layers.values():
            h = layer(h)
        return self.out(h)


def build(seed: int = 0, args: ToyArgs | None = None):
    """Model, AdamW and a LambdaLR schedule, initialized from `seed`."""
    torch.manual_seed(seed)
    model = ToyLM(args or ToyArgs())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    return model, optimizer, scheduler


def fingerprint(args: ToyArgs | None = None) -> dict:
    return {"name": "toy", "flavor": "test", "args": asdict(args or ToyArgs())}


class ToyData:
    """A stateful stream of token batches: its position and generator are its state."""

    def __init__(self, seed: int = 0, vocab_size: int = 32):
        self.vocab_size = vocab_size
        self.generator = torch.Generator().manual_seed(seed)
        self.position = 0

    def next(self) -> torch.Tensor:
        self.position += 1
        return torch.randint(0, self.vocab_size, (4, 9), generator=self.generator)

    def state_dict(self) -> dict:
        return {"position": self.position, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]
        self.generator.set_state(state["generator"])


class ToyShard:
    """A data-parallel rank's state for DataParallelState; records how it was restored."""

    def __init__(self, value: int = 0):
        self.value = value
        self.restored: tuple | None = None  # ("own", state) or ("resharded", states, dp_rank, dp_world_size)

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]
        self.restored = ("own", state)

    def load_state_dict_resharded(self, states: list[dict], dp_rank: int, dp_world_size: int) -> None:
        self.restored = ("resharded", states, dp_rank, dp_world_size)


def train_step(model, optimizer, scheduler, data: ToyData) -> float:
    batch = data.next()
    logits = model(batch[:, :-1])
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()
    return loss.item()


def toy_run(folder, seed=0, config=None, data_rank=0, model_fingerprint=None, args=None, **kwargs):
    """A toy training run with a CheckpointManager over model, optimizer, schedule and data (`args`: the model's
    shape, default ToyArgs())."""
    model, optimizer, scheduler = build(seed, args)
    data = ToyData(seed)
    states = {
        "model": ModelState(model),
        "optimizer": OptimizerState(model, optimizer),
        "lr_scheduler": scheduler,
        "dataloader": RankLocal(data, data_rank),
    }
    manager = CheckpointManager(
        folder,
        states,
        config or CheckpointConfig(interval=3),
        fingerprint=model_fingerprint or fingerprint(args),
        **kwargs,
    )
    run = SimpleNamespace(model=model, optimizer=optimizer, scheduler=scheduler, data=data, manager=manager)
    run.step = lambda: train_step(model, optimizer, scheduler, data)
    return run


def params(model):
    """A copy of the model's tensors."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


_TOP = {"tok.weight": "model.embed.weight", "out.weight": "lm_head.weight"}
_LAYER = {"norm": "ln.weight", "w_in.weight": "up.weight", "w_out.weight": "down.weight"}


class ToyAdapter:
    def __init__(self, args: ToyArgs):
        self.args = args

    @classmethod
    def from_args_dict(cls, fields: dict) -> ToyAdapter:
        return cls(ToyArgs(**fields))

    @classmethod
    def from_hf_config(cls, config: dict) -> ToyAdapter:
        return cls(ToyArgs(config["vocab_size"], config["hidden_size"], config["num_hidden_layers"]))

    architectures = ("ToyForCausalLM",)

    def args_dict(self) -> dict:
        return asdict(self.args)

    def hf_config(self, dtype=torch.bfloat16, **token_ids) -> dict:
        a = self.args
        return {
            "architectures": ["ToyForCausalLM"],
            "vocab_size": a.vocab_size,
            "hidden_size": a.dim,
            "num_hidden_layers": a.n_layers,
            "dtype": str(dtype).removeprefix("torch."),
            **token_ids,
        }

    def to_hf_key(self, fqn: str) -> str:
        if fqn in _TOP:
            return _TOP[fqn]
        _, i, rest = fqn.split(".", 2)
        return f"model.h.{i}.{_LAYER[rest]}"

    def from_hf_key(self, key: str) -> str:
        for ours, theirs in _TOP.items():
            if key == theirs:
                return ours
        parts = key.split(".", 3)
        if len(parts) != 4 or parts[:2] != ["model", "h"]:
            raise ValueError(f"{key!r} is not a toy parameter name")
        return f"layers.{parts[2]}.{ {v: k for k, v in _LAYER.items()}[parts[3]] }"

    def to_hf_tensor(self, fqn: str, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.flip(0) if fqn.endswith("w_in.weight") else tensor

    def from_hf_tensor(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.flip(0) if key.endswith("up.weight") else tensor

    def hf_keys(self) -> list[str]:
        layers = [f"model.h.{i}.{n}" for i in range(self.args.n_layers) for n in _LAYER.values()]
        return ["model.embed.weight", *layers, "lm_head.weight"]
