"""The CUDA allocator setting a real run would use, read from the environment as torch reads it.

torch takes ``PYTORCH_ALLOC_CONF`` and, when that is unset, ``PYTORCH_CUDA_ALLOC_CONF``: comma-separated
``option:value`` pairs. The dry run's allocator model follows ``expandable_segments``; any other option is
reported as not modelled, never dropped silently.
"""

import os
from dataclasses import dataclass, field

from titan_train.config import ConfigError

ENV_NAMES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


@dataclass(frozen=True)
class AllocatorSetting:
    source: str  # "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", or "default" when unset
    expandable_segments: bool = False
    unmodelled: list[str] = field(default_factory=list)


def allocator_setting(environ=os.environ) -> AllocatorSetting:
    name = next((n for n in ENV_NAMES if environ.get(n)), None)
    if name is None:
        return AllocatorSetting("default")
    text = environ[name]
    expandable, unmodelled = False, []
    for option in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = option.partition(":")
        key, value = key.strip(), value.strip()
        if key == "expandable_segments":
            if value not in ("True", "False"):  # torch's own check: exactly one of these words
                raise ConfigError(
                    f"{name}={text!r}: expandable_segments:{value!r} must be True or False "
                    "(torch rejects anything else)"
                )
            expandable = value == "True"
        else:
            unmodelled.append(
                f"allocator option {name} {key}:{value} (the allocator model runs without it: "
                + ("the whole caching allocator is replaced)" if key == "backend" else "reserved may differ)")
            )
    return AllocatorSetting(f"{name}={text}", expandable, unmodelled)
