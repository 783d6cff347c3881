"""Regional compile: `torch.compile` each repeated block on its own, as TorchTitan does.

The blocks share one structure, so dynamo traces it once and reuses the graph for every block (parameters
are graph inputs, not constants), and compile time stays that of one block however deep the model is.

Each block is compiled in place with `nn.Module.compile()`, which keeps the module and its names:
`torch.compile(block)` would instead return an `OptimizedModule` that inserts `_orig_mod.` into every
state_dict key. Apply after activation checkpointing (the compiled region then includes the checkpoint)
and before FSDP, like TorchTitan. Compilation happens at the first forward, not here.

The "inductor" backend on CPU generates C++ and needs a working compiler (g++ or clang++, as found by
`torch._inductor.config.cpp.cxx` / `CXX`); without one the first forward raises `InvalidCxxCompiler`.
"aot_eager" traces forward and backward the same way but runs them eagerly (no codegen, no compiler):
good for tests and for telling a tracing problem from a codegen one. "eager" only runs dynamo.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.utils._pytree import tree_map_only

BACKENDS = ("inductor", "aot_eager", "eager")


def apply_compile(model: nn.Module, block_fqns: list[str], backend: str = "inductor", fullgraph: bool = True) -> None:
    """Compile each block named by `block_fqns` (e.g. "layers.0") in place, keeping state_dict keys.

    fullgraph=True makes a graph break inside a block an error rather than a silent slowdown.
    """
    if backend not in BACKENDS:
        raise ValueError(f"compile.backend={backend!r} is not supported; use one of {', '.join(BACKENDS)}")
    for fqn in block_fqns:
        block = model.get_submodule(fqn)
        block.compile(backend=backend, fullgraph=fullgraph)
        # nn.Module.compile stores the compiled __call__ here; wrapping it runs eagerly, before the block's
        # own (compiled) hooks.
        block._compiled_call_impl = _wait_async_inputs(block._compiled_call_impl)


def _wait_async_inputs(compiled_call: Callable[..., Any]) -> Callable[..., Any]:
    """Resolve grad-requiring AsyncCollectiveTensor inputs with a differentiable op before the compiled call.

    Workaround for torch 2.13 (AOTAutograd's process_inputs unwraps an AsyncCollectiveTensor input with
    trigger_wait(), which drops its requires_grad; fixed upstream by pytorch/pytorch#191113). Tensor
    parallelism's async collectives hand such tensors across block boundaries (RowwiseParallel's
    `to_local()` of the embedding output feeds the first block): the compiled block then returns no
    gradient for that input, and the Redistribute behind it receives a zero-filled plain Tensor instead
    of a DTensor ('Tensor' object has no attribute '_local_tensor'). clone() waits on the collective and
    keeps the autograd edge; it copies one activation, only where such a tensor arrives.
    """
    try:
        from torch.distributed._functional_collectives import AsyncCollectiveTensor
    except ImportError:  # torch built without distributed: no async collectives to resolve
        return compiled_call

    def resolve(t: AsyncCollectiveTensor) -> Any:
        return t.clone() if t.requires_grad else t

    @functools.wraps(compiled_call)
    def call(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = tree_map_only(AsyncCollectiveTensor, resolve, (args, kwargs))
        return compiled_call(*args, **kwargs)

    return call
