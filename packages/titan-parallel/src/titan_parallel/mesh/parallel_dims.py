"""The parallel degrees of a run, their check against the world size, and the named device mesh."""

from dataclasses import dataclass, field

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from titan_parallel.options.option_names import named

# Outermost first: pipeline stages talk least often, tensor parallel most (keep it within a node).
MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
# Flattened views other code needs: data parallel (different data), FSDP sharding (dp_shard x cp: CP ranks
# shard parameters too), and the loss average (every rank that holds different tokens).
FLATTENED = {
    "dp": ("dp_replicate", "dp_shard"),
    "dp_shard_cp": ("dp_shard", "cp"),
    "dp_cp": ("dp_replicate", "dp_shard", "cp"),
}
# With expert parallelism dp_shard is two mesh dimensions: the experts' FSDP shards (outer, `edp_shard`) and
# the data ranks that, with every cp and tp rank, form one expert-parallel group (inner, `dp_shard_in_ep`),
# so an EP group's all-to-all stays on neighbouring ranks. Every view is flattened from these. Routed experts
# are never tensor-parallel beside EP: the tp ranks join the EP group instead (TorchTitan's ETP = 1).
EP_MESH_DIMS = ("pp", "dp_replicate", "edp_shard", "dp_shard_in_ep", "cp", "tp")
EP_FLATTENED = {
    "dp_shard": ("edp_shard", "dp_shard_in_ep"),
    "dp": ("dp_replicate", "edp_shard", "dp_shard_in_ep"),
    "dp_shard_cp": ("edp_shard", "dp_shard_in_ep", "cp"),
    "dp_cp": ("dp_replicate", "edp_shard", "dp_shard_in_ep", "cp"),
    "ep": ("dp_shard_in_ep", "cp", "tp"),
}


@dataclass
class ParallelDims:
    dp_replicate: int
    dp_shard: int
    """-1 takes whatever world size the other degrees leave."""
    cp: int
    tp: int
    pp: int
    world_size: int
    ep: int = 1
    """Expert parallel: ranks taken from dp_shard x cp x tp (every cp and tp rank first) that split the routed
    experts."""
    mesh: DeviceMesh | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        for name in ("dp_replicate", "cp", "tp", "pp", "ep"):
            if getattr(self, name) < 1:
                raise ValueError(f"{named(name)}={getattr(self, name)} must be >= 1")
        others = self.dp_replicate * self.cp * self.tp * self.pp
        if self.dp_shard == -1:
            if self.world_size % others:
                raise ValueError(
                    f"world size {self.world_size} is not divisible by {named('dp_replicate')}={self.dp_replicate} x "
                    f"{named('cp')}={self.cp} x {named('tp')}={self.tp} x {named('pp')}={self.pp} = {others}, so "
                    f"{named('dp_shard')}=-1 has no whole value"
                )
            self.dp_shard = self.world_size // others
        if self.dp_shard < 1:
            raise ValueError(f"{named('dp_shard')}={self.dp_shard} must be >= 1, or -1 for the rest of the world")
        product = others * self.dp_shard
        if product != self.world_size:
            raise ValueError(
                f"{named('dp_replicate')}={self.dp_replicate} x {named('dp_shard')}={self.dp_shard} x "
                f"{named('cp')}={self.cp} x {named('tp')}={self.tp} x {named('pp')}={self.pp} = {product}, but the "
                f"world size is {self.world_size}; the product must equal it"
            )
        if self.ep > 1:
            self._check_ep()

    def _check_ep(self) -> None:
        ep, inner = self.ep, self.cp * self.tp
        ranks = self.dp_shard * inner
        if ranks % ep or ep % inner:
            fits = [d for d in range(inner, ranks + 1, inner) if ranks % d == 0 and d > 1]
            raise ValueError(
                f"{named('ep')}={ep} must divide {named('dp_shard')}={self.dp_shard} x {named('cp')}={self.cp} x "
                f"{named('tp')}={self.tp} = {ranks} and be a multiple of {named('cp')} x {named('tp')} = {inner} "
                f"(expert-parallel ranks are the data, context and tensor-parallel ranks, every context and "
                f"tensor-parallel rank first); valid here: {fits or 'none (raise dp_shard)'}"
            )

    @property
    def edp_shard(self) -> int:
        """With EP, the ranks that FSDP-shard each expert (dp_shard x cp x tp / ep); dp_shard otherwise."""
        return self.dp_shard * self.cp * self.tp // self.ep if self.ep > 1 else self.dp_shard

    @property
    def dp_shard_in_ep(self) -> int:
        return self.ep // (self.cp * self.tp) if self.ep > 1 else 1

    def _mesh_dims(self) -> list[str]:
        """The mesh's dimensions, outermost first: those larger than 1 (with EP, edp_shard always, for the
        experts' FSDP mesh)."""
        if self.ep == 1:
            return [n for n in MESH_DIMS if getattr(self, n) > 1]
        return [n for n in EP_MESH_DIMS if getattr(self, n) > 1 or n == "edp_shard"]

    def _flattened(self) -> dict[str, tuple[str, ...]]:
        return EP_FLATTENED if self.ep > 1 else FLATTENED

    def degree(self, name: str) -> int:
        """Size of a mesh dimension or flattened view (1 where it is not used)."""
        if name == "ep":
            return self.ep
        parts = self._flattened().get(name, (name,))
        size = 1
        for part in parts:
            size *= getattr(self, part)
        return size

    @property
    def dp(self) -> int:
        """Ranks that see different data."""
        return self.degree("dp")

    def build_mesh(self, device_type: str) -> DeviceMesh | None:
        """The named mesh over the dimensions larger than 1, with the flattened views; None on one process."""
        names = self._mesh_dims()
        if not names:
            return None
        mesh = init_device_mesh(device_type, tuple(getattr(self, n) for n in names), mesh_dim_names=tuple(names))
        for flat, parts in self._flattened().items():
            present = tuple(p for p in parts if p in names)
            # A view of one dimension is that dimension; only real combinations need flattening.
            if len(present) > 1:
                mesh[present]._flatten(flat)
        self.mesh = mesh
        return mesh

    def submesh(self, name: str) -> DeviceMesh | None:
        """The mesh of one dimension or flattened view, or None where its degree is 1."""
        if self.mesh is None or self.degree(name) == 1:
            return None
        flattened, names = self._flattened(), self._mesh_dims()
        if name in flattened:
            present = [p for p in flattened[name] if p in names]
            if len(present) == 1:
                return self.mesh[present[0]]
        return self.mesh[name]

    def expert_fsdp_mesh(self) -> DeviceMesh:
        """With EP, where FSDP shards the experts: edp_shard (kept even at size 1), as a 2-D (dp_replicate,
        edp_shard) mesh for HSDP."""
        if self.mesh is None or self.ep == 1:
            raise ValueError("expert_fsdp_mesh: the mesh is not built or there is no expert parallelism")
        return self.mesh["dp_replicate", "edp_shard"] if self.dp_replicate > 1 else self.mesh["edp_shard"]

    def fsdp_mesh(self) -> DeviceMesh | None:
        """Where FSDP shards: dp_shard x cp, as a 2-D (dp_replicate, shard) mesh for HSDP; None without sharding."""
        if self.mesh is None or self.degree("dp_shard_cp") == 1:
            return None
        if self.ep > 1:  # dp_shard is flattened from two dimensions; so is every view over it
            shard = "dp_shard_cp" if self.cp > 1 else "dp_shard"
            present = [p for p in self._flattened()[shard] if p in self._mesh_dims()]
            shard = present[0] if len(present) == 1 else shard
        else:
            shard = "dp_shard_cp" if self.dp_shard > 1 and self.cp > 1 else ("dp_shard" if self.dp_shard > 1 else "cp")
        return self.mesh["dp_replicate", shard] if self.dp_replicate > 1 else self.mesh[shard]

    def expert_groups(self) -> list[list[int]]:
        """The global ranks of each expert-parallel group, as build_mesh lays them out (no process group
        needed: for a dry run's report). Position i of a group holds experts i * L .. (i + 1) * L - 1 of each
        layer (L = num_experts / ep). Empty without expert parallelism."""
        if self.ep == 1:
            return []
        names = self._mesh_dims()
        grid = torch.arange(self.world_size).reshape([getattr(self, n) for n in names])
        inner = [names.index(n) for n in EP_FLATTENED["ep"] if n in names]
        outer = [d for d in range(len(names)) if d not in inner]
        return grid.permute(*outer, *inner).reshape(-1, self.ep).tolist()

    def local_rank(self, name: str) -> int:
        """This rank's coordinate along a dimension or flattened view (0 where it is not used)."""
        mesh = self.submesh(name)
        return mesh.get_local_rank() if mesh is not None else 0

    def all_groups(self) -> list:
        """The process groups of every mesh dimension and flattened view (to set their timeouts)."""
        if self.mesh is None:
            return []
        names = self._mesh_dims()
        names += [flat for flat, parts in self._flattened().items() if sum(p in names for p in parts) > 1]
        return [self.mesh[name].get_group() for name in names]

    def describe(self) -> str:
        parts = [f"{k} {getattr(self, k)}" for k in ("dp_replicate", "dp_shard", "cp", "tp", "pp")]
        experts = f" (experts: ep {self.ep} x fsdp {self.edp_shard})" if self.ep > 1 else ""
        return f"world {self.world_size} = " + " x ".join(parts) + experts
