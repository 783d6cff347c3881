"""How an error message names a parameter: by its own name (`schedule=`, `pp_degree=`), unless the caller
said how its users set it. A trainer maps the parameters to its config keys once, as data
(`with option_names({"schedule": "parallelism.pipeline_parallel_schedule", ...})`), so a message can tell
its user which key to change, and no caller rewrites message text after the fact.
"""

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar

_NAMES: ContextVar[Mapping[str, str] | None] = ContextVar("titan_parallel_option_names", default=None)


@contextlib.contextmanager
def option_names(names: Mapping[str, str]) -> Iterator[None]:
    """Inside: messages call parameter `p` `names[p]` (the parameter's own name where `names` has none)."""
    token = _NAMES.set({**(_NAMES.get() or {}), **names})
    try:
        yield
    finally:
        _NAMES.reset(token)


def named(parameter: str) -> str:
    """What messages call `parameter` here."""
    return (_NAMES.get() or {}).get(parameter, parameter)
