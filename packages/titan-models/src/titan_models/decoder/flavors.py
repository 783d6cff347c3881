"""A family's table of named decoder sizes. Besides the names, `hf:<folder>` is the shape a Hugging Face
folder's config.json describes, so `--model.flavor hf:Llama-3.2-1B` fine-tunes a downloaded model with no
flavor to match; its multi-token prediction layers are those the config declares and the weights hold
(hf_folder.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from titan_models.decoder.args import DecoderArgs
from titan_models.decoder.hf_folder import with_mtp_layers_held

HF_PREFIX = "hf:"


def _hf_config_file(flavor: object) -> Path | None:
    if not isinstance(flavor, str) or not flavor.startswith(HF_PREFIX):
        return None
    file = Path(flavor[len(HF_PREFIX) :]).expanduser() / "config.json"
    return file if file.is_file() else None


class Flavors(dict):
    """The named flavors; `hf:<folder>` keys are read from the folder's config.json on lookup (they are
    neither stored nor listed) by `read_config` (config.json -> args, the family's reader)."""

    def __init__(self, flavors: dict, read_config: Callable[[dict[str, Any]], DecoderArgs], family: str):
        super().__init__(flavors)
        self.read_config, self.family = read_config, family

    def __contains__(self, flavor: object) -> bool:
        return super().__contains__(flavor) or _hf_config_file(flavor) is not None

    def __getitem__(self, flavor: str) -> DecoderArgs:
        if super().__contains__(flavor):
            return super().__getitem__(flavor)
        file = _hf_config_file(flavor)
        if file is None:
            raise KeyError(flavor)
        try:
            args = self.read_config(json.loads(file.read_text()))
        except (ValueError, KeyError) as e:
            raise ValueError(f"{file} does not describe a {self.family} model this package builds: {e}") from e
        return with_mtp_layers_held(args, file.parent)
