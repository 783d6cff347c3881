"""Data parallelism: FSDP2 (fully_shard; HSDP on a 2-D mesh) or DDP (replicate), block by block."""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

RESHARD_POLICIES = ("default", "always", "never")


def _reshard_after_forward(policy: str, pp_enabled: bool) -> bool:
    if policy not in RESHARD_POLICIES:
        raise ValueError(f"reshard_after_forward={policy!r} is not allowed; use one of {RESHARD_POLICIES}")
    if policy == "default":
        # Pipeline schedules run several micro-batches' forwards before their backwards: re-gathering for
        # each would multiply the all-gathers, so keep the parameters unsharded between them.
        return not pp_enabled
    return policy == "always"


def apply_fsdp(
    model: nn.Module,
    block_fqns: list[str],
    mesh: DeviceMesh,
    param_dtype: torch.dtype = torch.float32,
    reduce_dtype: torch.dtype = torch.float32,
    reshard_after_forward: str = "default",
    pp_enabled: bool = False,
    experts: list[nn.Module] = (),
    expert_mesh: DeviceMesh | None = None,
    expert_divide_factor: int | None = None,
) -> nn.Module:
    """Shard each block, then the root (what is left: embeddings, final norm, output), over `mesh`.

    A 1-D mesh is FSDP; a 2-D mesh ("dp_replicate", "dp_shard_cp") is HSDP: sharded within a group,
    replicated across groups. Gradients are reduced in `reduce_dtype` and averaged over the mesh.

    `experts`: expert-parallel modules (apply_ep), each its own unit over `expert_mesh` (the data ranks
    that hold the same experts), inside its block (or, outside every block, e.g. a multi-token prediction
    module's, before the root). Their gradients already sum the rows of the whole
    expert-parallel group, so they are divided by `expert_divide_factor` (every data rank: what the dense
    gradients are averaged over) rather than by the expert mesh's size.
    """
    reshard = _reshard_after_forward(reshard_after_forward, pp_enabled)
    mp_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)

    def shard_experts(modules, reshard_after_forward: bool) -> None:
        for module in modules:
            fully_shard(module, mesh=expert_mesh, mp_policy=mp_policy, reshard_after_forward=reshard_after_forward)
            module.set_gradient_divide_factor(float(expert_divide_factor))

    outside = {id(e): e for e in experts}
    for i, fqn in enumerate(block_fqns):
        # The last block's parameters are needed again right at the start of backward.
        block_reshard = reshard and i < len(block_fqns) - 1
        block = model.get_submodule(fqn)
        inside = {id(m) for m in block.modules()}
        shard_experts([e for e in experts if id(e) in inside], block_reshard)
        outside = {key: e for key, e in outside.items() if key not in inside}
        fully_shard(block, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=block_reshard)
    shard_experts(outside.values(), reshard)  # their parameters live on the expert mesh, not the root's
    fully_shard(model, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=reshard)
    if _is_gloo(mesh):
        # gloo has no PREMUL_SUM/AVG (what FSDP uses to average): reduce with SUM and divide instead,
        # so the gradients equal those on NCCL. Not for experts FSDP shards over one rank: with no
        # reduce-scatter FSDP divides by the custom factor in its copy and, forced to sum, once more.
        alone = {id(e) for e in experts if expert_mesh.size(expert_mesh.ndim - 1) == 1}
        for module in model.modules():
            if isinstance(module, FSDPModule) and id(module) not in alone:
                module.set_force_sum_reduction_for_comms(True)
    return model


def _is_gloo(mesh: DeviceMesh) -> bool:
    return any(dist.get_backend(mesh.get_group(d)) == "gloo" for d in range(mesh.ndim))


def apply_ddp(model: nn.Module, mesh: DeviceMesh, compiled: bool = False) -> nn.Module:
    """Replicate the whole model over `mesh`; gradients are all-reduced (averaged) in buckets."""
    from torch.distributed._composable.replicate import replicate

    if compiled:
        # Lets dynamo split graphs at DDP bucket boundaries so communication overlaps compiled compute.
        torch._dynamo.config.optimize_ddp = "ddp_optimizer"
    replicate(model, device_mesh=mesh, bucket_cap_mb=100)
    return model
