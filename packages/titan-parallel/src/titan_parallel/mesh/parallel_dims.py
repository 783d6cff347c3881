"""The parallel degrees of a run, their check against the world size, and the named device mesh."""

from dataclasses import dataclass, field

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


@dataclass
class ParallelDims:
    dp_replicate: int
    dp_shard: int
    """-1 takes whatever world size the other degrees leave."""
    cp: int
    tp: int
    pp: int
    world_size: int
    mesh: DeviceMesh | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        for name in ("dp_replicate", "cp", "tp", "pp"):
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

    def degree(self, name: str) -> int:
        """Size of a mesh dimension or flattened view (1 where it is not used)."""
        parts = FLATTENED.get(name, (name,))
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
        names = [n for n in MESH_DIMS if getattr(self, n) > 1]
        if not names:
            return None
        mesh = init_device_mesh(device_type, tuple(getattr(self, n) for n in names), mesh_dim_names=tuple(names))
        for flat, parts in FLATTENED.items():
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
        if name in FLATTENED:
            present = [p for p in FLATTENED[name] if getattr(self, p) > 1]
            if len(present) == 1:
                return self.mesh[present[0]]
        return self.mesh[name]

    def fsdp_mesh(self) -> DeviceMesh | None:
        """Where FSDP shards: dp_shard x cp, as a 2-D (dp_replicate, shard) mesh for HSDP; None without sharding."""
        if self.mesh is None or self.degree("dp_shard_cp") == 1:
            return None
        shard = "dp_shard_cp" if self.dp_shard > 1 and self.cp > 1 else ("dp_shard" if self.dp_shard > 1 else "cp")
        return self.mesh["dp_replicate", shard] if self.dp_replicate > 1 else self.mesh[shard]

    def local_rank(self, name: str) -> int:
        """This rank's coordinate along a dimension or flattened view (0 where it is not used)."""
        mesh = self.submesh(name)
        return mesh.get_local_rank() if mesh is not None else 0

    def all_groups(self) -> list:
        """The process groups of every mesh dimension and flattened view (to set their timeouts)."""
        if self.mesh is None:
            return []
        names = [n for n in MESH_DIMS if getattr(self, n) > 1]
        names += [flat for flat, parts in FLATTENED.items() if sum(getattr(self, p) > 1 for p in parts) > 1]
        return [self.mesh[name].get_group() for name in names]

    def describe(self) -> str:
        parts = [f"{k} {getattr(self, k)}" for k in ("dp_replicate", "dp_shard", "cp", "tp", "pp")]
        return f"world {self.world_size} = " + " x ".join(parts)
