"""Which modules a plan's FQN pattern names, by the rule torch's `parallelize_module` applies to its keys:
as many dot-separated names as the pattern has, each an fnmatch of its token ("layers.*.moe.experts";
"*" matches one name, never a dot). Every parallelism that takes patterns finds its modules here, so each
finds the modules torch would."""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase

import torch.nn as nn


def fqn_matches(pattern: str, fqn: str) -> bool:
    """Whether the module FQN `fqn` is one `pattern` names."""
    tokens, names = pattern.split("."), fqn.split(".")
    return len(tokens) == len(names) and all(
        fnmatchcase(name, token) for name, token in zip(names, tokens, strict=True)
    )


def modules_matching(model: nn.Module, patterns: str | Iterable[str]) -> dict[str, nn.Module]:
    """The submodules of `model` (never `model` itself) that any of `patterns` names, by FQN, in
    `named_modules` order."""
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    return {
        fqn: module
        for fqn, module in model.named_modules()
        if fqn and any(fqn_matches(pattern, fqn) for pattern in patterns)
    }
