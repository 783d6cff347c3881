"""Launched by test_simple_fsdp.py: `torchrun --nproc_per_node N simple_fsdp_script.py GROUP [FOLDER]`. Prints
"rank R CASE ok" for each case that passes.

Parity cases build the toy model (pp_toy.py) on the meta device, apply TP / AC / compile / SimpleFSDP in the
trainer's order, materialize it, copy in the plain model's weights, and run two SGD steps against the plain
model on the same global batch, each data-parallel rank taking its slice: losses rtol 1e-5 and every
parameter's full gradient rtol 1e-4 / atol 1e-6, fp32. Compiled cases compile each block with "aot_eager".

"two" (2 ranks): fully_shard and replicate, eager and compiled; without recompute; with AC; mixed
precision; memory; state_dict and DCP against FSDP2 (checkpoints under FOLDER). "four" (4 ranks):
fully_shard 4, hybrid 2 x 2, fully_shard 2 x TP 2, eager and compiled, and the 2-D state_dicts against
FSDP2. "inductor" (2 ranks): fully_shard 2 compiled with inductor, plain and with each CPU overlap mode.
"""

import os
import re
import sys
import weakref

import pp_toy
import torch
import torch._functorch.config
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from multiprocess import run_cases
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.debugging import boxed_nop
from torch._functorch.aot_autograd import make_boxed_func
from torch._inductor.utils import run_and_get_code
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.utils._python_dispatch import TorchDispatchMode

from titan_parallel import (
    apply_ac,
    apply_compile,
    apply_fsdp,
    apply_simple_fsdp,
    apply_tp,
    enable_overlap,
    sharded_params,
)

STEPS, LR, LOCAL_BATCH = 2, 0.5, 2
WRAPPED = "_checkpoint_wrapped_module."
GATHERS_PER_BLOCK = 9  # 7 linear weights and 2 norm weights


def build(mesh, mode="fully_shard", *, tp_mesh=None, ac=None, compile=None, fsdp2=False, **options):
    """The toy model built on meta, parallelized, materialized and given the plain model's weights."""
    with torch.device("meta"):
        model = pp_toy.ToyModel()
    blocks = pp_toy.block_fqns()
    if tp_mesh is not None:
        apply_tp(model, tp_mesh, pp_toy.tp_plan(loss_parallel=False))
    if ac:
        apply_ac(model, blocks, *ac)
    if callable(compile):  # a test backend, compiled in place as apply_compile does
        for fqn in blocks:
            model.get_submodule(fqn).compile(backend=compile, fullgraph=True)
    elif compile:
        apply_compile(model, blocks, backend=compile)
    if fsdp2:
        apply_fsdp(model, blocks, mesh, **options)
    else:
        apply_simple_fsdp(model, mesh, mode, block_fqns=blocks, **options)
    model.to_empty(device="cpu")
    model.rope = pp_toy.rope_table()  # a non-persistent buffer: to_empty leaves it uninitialized
    reference = pp_toy.build_model()
    with torch.no_grad(), sharded_params():
        for name, param in model.named_parameters():
            value = reference.get_parameter(name.replace(WRAPPED, ""))
            if isinstance(param, DTensor):
                value = distribute_tensor(value, param.device_mesh, param.placements)
            param.copy_(value)
    return model


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def check_parity(model, dp_mesh, *, rtol=1e-4, atol=1e-6, loss_rtol=1e-5):
    flat = dp_mesh._flatten() if dp_mesh.ndim > 1 else dp_mesh  # HSDP: one rank order over both dimensions
    dp, dp_rank = flat.size(), flat.get_local_rank()
    reference = pp_toy.build_model()
    optimizers = [torch.optim.SGD(m.parameters(), lr=LR) for m in (reference, model)]
    for step in range(STEPS):
        inputs, labels = pp_toy.batch(LOCAL_BATCH * dp, seed=step)
        for opt in optimizers:
            opt.zero_grad()
        expected = pp_toy.cross_entropy(reference(inputs), labels)
        expected.backward()
        local = slice(dp_rank * LOCAL_BATCH, (dp_rank + 1) * LOCAL_BATCH)
        loss = pp_toy.cross_entropy(model(inputs[local]), labels[local])
        loss.backward()
        loss = loss.detach().clone()
        dist.all_reduce(loss, group=flat.get_group())
        where = f"step {step}"
        msg = lambda m, where=where: f"{where}: {m}"
        torch.testing.assert_close(loss / dp, expected.detach(), rtol=loss_rtol, atol=0, msg=msg)
        for name, param in model.named_parameters():
            ref = reference.get_parameter(name.replace(WRAPPED, "")).grad
            msg = lambda m, where=f"{where} {name}": f"{where}: {m}"
            torch.testing.assert_close(full(param.grad).float(), ref, rtol=rtol, atol=atol, msg=msg)
        for opt in optimizers:
            opt.step()


def parity(mesh, mode="fully_shard", dp_mesh=None, **kwargs):
    check_parity(build(mesh, mode, **kwargs), dp_mesh if dp_mesh is not None else mesh)


def check_mixed_precision(mesh):
    """bf16 compute, fp32 reduction. Against the fp32 plain model (bf16 rounding: loss rtol 1e-2, gradients
    rtol 5e-2 / atol 2e-3), and against FSDP2 with the same policy (the same casts and collectives: loss rtol
    1e-4, gradients rtol 1e-3 / atol 1e-5)."""
    options = {"param_dtype": torch.bfloat16, "reduce_dtype": torch.float32}
    check_parity(build(mesh, **options), mesh, rtol=5e-2, atol=2e-3, loss_rtol=1e-2)
    simple, fsdp2 = build(mesh, **options), build(mesh, fsdp2=True, **options)
    optimizers = [torch.optim.SGD(m.parameters(), lr=LR) for m in (simple, fsdp2)]
    for step in range(STEPS):
        inputs, labels = pp_toy.batch(LOCAL_BATCH, seed=10 * step + mesh.get_local_rank())
        losses = []
        for model, opt in zip((simple, fsdp2), optimizers, strict=True):
            opt.zero_grad()
            losses.append(pp_toy.cross_entropy(model(inputs), labels))
            losses[-1].backward()
        torch.testing.assert_close(losses[0], losses[1], rtol=1e-4, atol=0)
        for (name, a), (_, b) in zip(simple.named_parameters(), fsdp2.named_parameters(), strict=True):
            msg = lambda m, name=name: f"{name}: {m}"
            torch.testing.assert_close(full(a.grad), full(b.grad), rtol=1e-3, atol=1e-5, msg=msg)
        for opt in optimizers:
            opt.step()


class GatherRecorder(TorchDispatchMode):
    """Weak references to the storage of each all-gather output (an unsharded parameter). A storage's Python
    object lives exactly as long as the storage (PyObject preservation), so its weak reference dies only when
    no tensor, view or saved tensor holds the buffer any more."""

    def __init__(self):
        super().__init__()
        self.outputs, self.recording = [], True

    def record(self, out: torch.Tensor) -> None:
        if self.recording:
            self.outputs.append((weakref.ref(out.untyped_storage()), out.nbytes))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # eager: every op passes here
        out = func(*args, **(kwargs or {}))
        if func is torch.ops._c10d_functional.all_gather_into_tensor.default:
            self.record(out)
        return out

    def live_bytes(self) -> int:
        return sum(nbytes for ref, nbytes in self.outputs if ref() is not None)

    def backend(self):
        """aot_eager whose forward graphs record their all-gather outputs (dynamo refuses to trace under a
        dispatch mode, so compiled blocks record from inside the graph instead)."""
        recorder = self

        class Recording(torch.fx.Interpreter):  # frees each value after its last use, as the graph does
            def run_node(self, node):
                out = super().run_node(node)
                if node.target is torch.ops._c10d_functional.all_gather_into_tensor.default:
                    recorder.record(out)
                return out

        def forward_compiler(gm, example_inputs):
            return make_boxed_func(lambda *args: Recording(gm).run(*args))

        return aot_autograd(fw_compiler=forward_compiler, bw_compiler=boxed_nop)


def unsharded_bytes_at_first_block_backward(compiled: bool, recompute: bool) -> int:
    """Bytes of the forward's all-gather outputs still alive when backward reaches the first block."""
    mesh = init_device_mesh("cpu", (2,))
    recorder, seen = GatherRecorder(), []
    model = build(mesh, compile=recorder.backend() if compiled else None, recompute_all_gather=recompute)

    def on_output(module, args, out):  # the output's gradient arrives just before the block's backward
        out.register_hook(lambda grad: seen.append(recorder.live_bytes()))

    model.layers["0"].register_forward_hook(on_output)
    inputs, labels = pp_toy.batch(LOCAL_BATCH)
    if compiled:
        loss = pp_toy.cross_entropy(model(inputs), labels)
    else:
        with recorder:
            loss = pp_toy.cross_entropy(model(inputs), labels)
    recorder.recording = False  # backward's own gathers are not what is measured
    loss.backward()
    expected = 4 * GATHERS_PER_BLOCK if compiled else len(list(model.parameters()))  # compiled: blocks only
    assert len(recorder.outputs) == expected, f"recorded {len(recorder.outputs)} all-gathers, expected {expected}"
    return seen[0]


def check_memory(compiled: bool):
    # The control: without recompute, at least the first block's gathered linear weights wait for its backward.
    kept = unsharded_bytes_at_first_block_backward(compiled, recompute=False)
    assert kept >= 7 * 32 * 32 * 4, f"the control kept only {kept} bytes: the measurement sees nothing"
    live = unsharded_bytes_at_first_block_backward(compiled, recompute=True)
    assert live == 0, f"{live} bytes of gathered parameters were kept for backward"


def check_state_dict(mesh, mode="fully_shard", tp_mesh=None, folder=None):
    """Keys, shapes, placements and local shards equal FSDP2's on the same mesh; DCP both ways."""
    simple = build(mesh, mode, tp_mesh=tp_mesh)
    fsdp2 = build(mesh, tp_mesh=tp_mesh, fsdp2=True)
    ours, theirs = simple.state_dict(), fsdp2.state_dict()
    assert list(ours) == list(theirs), (list(ours), list(theirs))
    for key, value in ours.items():
        other = theirs[key]
        assert value.placements == other.placements, (key, value.placements, other.placements)
        assert value.device_mesh.mesh.tolist() == other.device_mesh.mesh.tolist(), key
        assert value.device_mesh.mesh_dim_names == other.device_mesh.mesh_dim_names, key
        assert value.shape == other.shape, key
        torch.testing.assert_close(value.to_local(), other.to_local(), rtol=0, atol=0)
    if folder is None:
        return
    # Change one model's weights, save it, load into the other, and compare the full weights; then back.
    for source, target, name in ((simple, fsdp2, "simple_to_fsdp2"), (fsdp2, simple, "fsdp2_to_simple")):
        with torch.no_grad(), sharded_params():
            for param in source.parameters():
                param.mul_(1.5).add_(0.25)
        path = os.path.join(folder, name)
        dcp.save(source.state_dict(), checkpoint_id=path)
        state = target.state_dict()
        dcp.load(state, checkpoint_id=path)
        target.load_state_dict(state)
        for (key, a), (_, b) in zip(source.named_parameters(), target.named_parameters(), strict=True):
            msg = lambda m, where=f"{name} {key}": f"{where}: {m}"
            torch.testing.assert_close(full(a), full(b), rtol=0, atol=0, msg=msg)


def check_inductor(mesh, overlap: str):
    """Parity compiled with inductor, and the collectives in the compiled block's code: one all-gather and
    one reduce-scatter per block with bucketing, one per parameter without; with "bucket_reorder" (only)
    some compute kernel runs between a collective's issue and its wait (measured on CPU: the backward's
    re-gather is issued one kernel early), where the other modes wait at once."""
    enable_overlap(overlap, "inductor", "cpu")
    # A cached graph would skip the code generation the capture reads; the kernels it generates still come from
    # inductor's on-disk kernel cache (keyed by their source), so the three modes compile their shared kernels once.
    no_graph_cache = torch._functorch.config.patch(enable_autograd_cache=False)
    with torch._inductor.config.patch(fx_graph_cache=False), no_graph_cache:
        _, codes = run_and_get_code(lambda: parity(mesh, compile="inductor"))
    forward, backward = codes  # the blocks share one graph: one forward and one backward
    expected = 1 if overlap != "none" else GATHERS_PER_BLOCK
    gathers = len(re.findall(r"all_gather_into_tensor(_out)?\.default\(", forward))
    scatters = len(re.findall(r"reduce_scatter_tensor\.default\(", backward))
    assert (gathers, scatters) == (expected, expected), (gathers, scatters, expected)
    in_flight = kernels_in_flight(forward) + kernels_in_flight(backward)
    assert (max(in_flight) > 0) == (overlap == "bucket_reorder"), (overlap, in_flight)


COLLECTIVE = re.compile(
    r"(\w+) = torch\.ops\._c10d_functional\.(all_gather_into_tensor|reduce_scatter_tensor)\w*\.default\("
    r"|torch\.ops\._c10d_functional\.all_gather_into_tensor_out\.default\(.*out=(\w+)"
)
KERNEL = re.compile(r"^\s*(cpp_fused_\w+|extern_kernels\.\w+)\(")


def kernels_in_flight(code: str) -> list[int]:
    """For each collective in the generated code, how many compute kernels run between its issue and its
    wait_tensor: 0 when it is waited on at once."""
    lines, counts = code.splitlines(), []
    for i, line in enumerate(lines):
        match = COLLECTIVE.search(line)
        if not match:
            continue
        buffer = match.group(1) or match.group(3)
        wait = next(j for j in range(i + 1, len(lines)) if re.search(rf"wait_tensor\.default\({buffer}\b", lines[j]))
        counts.append(sum(bool(KERNEL.search(lines[k])) for k in range(i + 1, wait)))
    return counts


def cases(group: str) -> dict:
    if group == "two":
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp_shard",))
        return {
            "fully_shard2": lambda: parity(mesh),
            "fully_shard2_compiled": lambda: parity(mesh, compile="aot_eager"),
            "replicate2": lambda: parity(mesh, "replicate"),
            "replicate2_compiled": lambda: parity(mesh, "replicate", compile="aot_eager"),
            "no_recompute2": lambda: parity(mesh, recompute_all_gather=False),
            "full_ac2": lambda: parity(mesh, ac=("full",)),
            "op_ac2_compiled": lambda: parity(mesh, ac=("selective", "op"), compile="aot_eager"),
            "mixed_precision2": lambda: check_mixed_precision(mesh),
            "memory_eager": lambda: check_memory(compiled=False),
            "memory_compiled": lambda: check_memory(compiled=True),
            "state_dict_dcp2": lambda: check_state_dict(mesh, folder=sys.argv[2]),
        }
    if group == "four":
        flat = init_device_mesh("cpu", (4,), mesh_dim_names=("dp_shard",))
        hsdp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
        dp_tp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))
        dp, tp = dp_tp["dp_shard"], dp_tp["tp"]
        return {
            "fully_shard4": lambda: parity(flat),
            "fully_shard4_compiled": lambda: parity(flat, compile="aot_eager"),
            "hybrid2x2": lambda: parity(hsdp, "hybrid_shard"),
            "hybrid2x2_compiled": lambda: parity(hsdp, "hybrid_shard", compile="aot_eager"),
            "fully_shard2_tp2": lambda: parity(dp, tp_mesh=tp),
            "fully_shard2_tp2_compiled": lambda: parity(dp, tp_mesh=tp, compile="aot_eager"),
            "state_dict_hybrid2x2": lambda: check_state_dict(hsdp, "hybrid_shard"),
            "state_dict_tp2": lambda: check_state_dict(dp, tp_mesh=tp),
        }
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp_shard",))
    # In this order: enable_overlap sets process-wide options, and bucket_reorder includes bucket's.
    return {
        f"inductor_{mode}": lambda mode=mode: check_inductor(mesh, mode)
        for mode in ("none", "bucket", "bucket_reorder")
    }


if __name__ == "__main__":
    # Not deterministic for "inductor": deterministic algorithms switch inductor's reordering pass off.
    run_cases(lambda: cases(sys.argv[1]), deterministic=sys.argv[1] != "inductor", fresh_compile=True)
