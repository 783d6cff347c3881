"""Named Llama 3 sizes. The large ones are the published Llama 3.1 and 3.2 shapes (Meta's params.json).

Besides the names, `hf:<folder>` is the shape a Hugging Face folder's config.json describes (any Llama 3,
3.1 or 3.2), so `--model.flavor hf:Llama-3.2-1B` fine-tunes a downloaded model with no flavor to match.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from titan_models.llama3.args import Llama3Args, RopeScaling
from titan_models.llama3.hf_config import args_from_hf_config

HF_PREFIX = "hf:"


def _hf_config_file(flavor: object) -> Path | None:
    if not isinstance(flavor, str) or not flavor.startswith(HF_PREFIX):
        return None
    file = Path(flavor[len(HF_PREFIX) :]).expanduser() / "config.json"
    return file if file.is_file() else None


class Flavors(dict):
    """The named flavors; `hf:<folder>` keys are read from the folder's config.json on lookup (they are
    neither stored nor listed) by `read_config` (config.json -> args; Llama 3's unless given)."""

    def __init__(self, flavors: dict, read_config=args_from_hf_config, family: str = "Llama 3"):
        super().__init__(flavors)
        self.read_config, self.family = read_config, family

    def __contains__(self, flavor: object) -> bool:
        return super().__contains__(flavor) or _hf_config_file(flavor) is not None

    def __getitem__(self, flavor: str) -> Llama3Args:
        if super().__contains__(flavor):
            return super().__getitem__(flavor)
        file = _hf_config_file(flavor)
        if file is None:
            raise KeyError(flavor)
        try:
            return self.read_config(json.loads(file.read_text()))
        except (ValueError, KeyError) as e:
            raise ValueError(f"{file} does not describe a {self.family} model this package builds: {e}") from e


FLAVORS: dict[str, Llama3Args] = Flavors(
    {
        # Small enough for multi-process CPU tests; n_kv_heads < n_heads so GQA paths are exercised; 4 layers so
        # two pipeline ranks can hold two stages each.
        "tiny": Llama3Args(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=2048, max_seq_len=512),
        # tiny, deeper and wider in heads: 8 blocks for 4 pipeline ranks of 2 stages, 4 kv heads for TP 4.
        "tiny8": Llama3Args(dim=64, n_layers=8, n_heads=8, n_kv_heads=4, vocab_size=2048, max_seq_len=512),
        # tiny in the Llama 3.1 style (RoPE scaling) and the 3.2 style (scaling and tied embeddings), scaled to
        # short contexts so the scaling changes frequencies the tests' sequences reach.
        "tiny-3.1": Llama3Args(
            dim=64,
            n_layers=4,
            n_heads=4,
            n_kv_heads=2,
            vocab_size=2048,
            max_seq_len=512,
            rope_scaling=RopeScaling(factor=4.0, original_max_position_embeddings=128),
        ),
        # TorchTitan's debugmodel: the model the integration tests train.
        "debug": Llama3Args(dim=256, n_layers=6, n_heads=16, vocab_size=2048, rope_theta=500000),
        # Llama 3.2 1B / 3B: tied embeddings, RoPE scaled 32x from an 8192-token pre-training context.
        "1B": Llama3Args(
            dim=2048,
            n_layers=16,
            n_heads=32,
            n_kv_heads=8,
            vocab_size=128256,
            ffn_hidden_dim=8192,
            rope_theta=500000,
            rope_scaling=RopeScaling(factor=32.0),
            max_seq_len=131072,
            tie_word_embeddings=True,
        ),
        "3B": Llama3Args(
            dim=3072,
            n_layers=28,
            n_heads=24,
            n_kv_heads=8,
            vocab_size=128256,
            ffn_hidden_dim=8192,
            rope_theta=500000,
            rope_scaling=RopeScaling(factor=32.0),
            max_seq_len=131072,
            tie_word_embeddings=True,
        ),
        "8B": Llama3Args(
            dim=4096,
            n_layers=32,
            n_heads=32,
            n_kv_heads=8,
            vocab_size=128256,
            ffn_dim_multiplier=1.3,
            multiple_of=1024,
            rope_theta=500000,
            rope_scaling=RopeScaling(),
            max_seq_len=131072,
        ),
        "70B": Llama3Args(
            dim=8192,
            n_layers=80,
            n_heads=64,
            n_kv_heads=8,
            vocab_size=128256,
            ffn_dim_multiplier=1.3,
            multiple_of=4096,
            rope_theta=500000,
            rope_scaling=RopeScaling(),
            max_seq_len=131072,
        ),
        "405B": Llama3Args(
            dim=16384,
            n_layers=126,
            n_heads=128,
            n_kv_heads=8,
            vocab_size=128256,
            ffn_dim_multiplier=1.2,
            multiple_of=4096,
            rope_theta=500000,
            rope_scaling=RopeScaling(),
            max_seq_len=131072,
        ),
    }
)
FLAVORS["tiny-3.2"] = dataclasses.replace(FLAVORS["tiny-3.1"], tie_word_embeddings=True)
