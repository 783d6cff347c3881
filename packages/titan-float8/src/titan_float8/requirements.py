"""torchao, imported only when float8 is used, with a clear error when it is missing or too old.

torchao is imported lazily: importing it loads its C++ extensions and registers tensor subclasses, which
a run without float8 should not pay for or hear about.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import logging
import re
from types import ModuleType

import torch

MIN_TORCHAO = "0.18.0"
"""The oldest torchao this package is tested with (the API of torchao.float8 moves between releases)."""

TORCHAO_BELOW = "0.19"
"""The first torchao not tested: this package uses torchao.float8 modules that it does not export."""

INSTALL_HINT = f'pip install "torchao>={MIN_TORCHAO},<{TORCHAO_BELOW}"'


def require_torchao() -> ModuleType:
    """`torchao.float8`, or ImportError / RuntimeError naming the pip command that fixes it."""
    installed = _installed_version()
    if installed is not None and _release(installed) < _release(MIN_TORCHAO):
        raise RuntimeError(
            f"float8 training needs torchao>={MIN_TORCHAO} but torchao {installed} is installed; {INSTALL_HINT}"
        )
    try:
        with _quiet_cpu_import():
            return importlib.import_module("torchao.float8")
    except ImportError as error:
        raise ImportError(
            f"float8 training needs torchao>={MIN_TORCHAO}, which could not be imported ({error}); {INSTALL_HINT}"
        ) from error


@functools.cache  # precompute_float8_scales asks every step
def _installed_version() -> str | None:
    try:
        return importlib.metadata.version("torchao")
    except importlib.metadata.PackageNotFoundError:
        return None  # not installed, or a source checkout on sys.path: the import decides


def _release(version: str) -> tuple[int, ...]:
    """(0, 18, 0) from "0.18.0", "0.18.0+cu128" or "0.19.0.dev20260101"; a pre-release counts as its release."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        return (0,)
    return tuple(int(part or 0) for part in match.groups())


class _DropKnownNoise(logging.Filter):
    def __init__(self, fragments: tuple[str, ...]):
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(fragment in message for fragment in self.fragments)


@contextlib.contextmanager
def _quiet_cpu_import():
    """Silence two warnings that `import torchao` prints on every start and that mean nothing here.

    - The torchao wheel ships CUDA-only kernels (_C_mxfp8, _C_cutlass_90a) linked against libtorch_cuda;
      on a CPU build of torch they cannot load and torchao logs "Failed to load ...so" for each. Kept on
      CUDA builds, where a failed load is news.
    - torch 2.13 logs that torchao 0.18 registers an Enum (KernelPreference) as a pytree constant, which
      is deprecated but still works.
    """
    filters = [(logging.getLogger("torch.utils._pytree"), _DropKnownNoise(("is an Enum subclass",)))]
    if torch.version.cuda is None and torch.version.hip is None:
        filters.append((logging.getLogger("torchao"), _DropKnownNoise(("Failed to load",))))
    for logger, noise in filters:
        logger.addFilter(noise)
    try:
        yield
    finally:
        for logger, noise in filters:
            logger.removeFilter(noise)
