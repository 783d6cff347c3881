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

from torch import nn

BACKENDS = ("inductor", "aot_eager", "eager")


def apply_compile(model: nn.Module, block_fqns: list[str], backend: str = "inductor", fullgraph: bool = True) -> None:
    """Compile each block named by `block_fqns` (e.g. "layers.0") in place, keeping state_dict keys.

    fullgraph=True makes a graph break inside a block an error rather than a silent slowdown.
    """
    if backend not in BACKENDS:
        raise ValueError(f"compile.backend={backend!r} is not supported; use one of {', '.join(BACKENDS)}")
    for fqn in block_fqns:
        model.get_submodule(fqn).compile(backend=backend, fullgraph=fullgraph)
