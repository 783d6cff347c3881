"""The parallel degrees of a run and their product check against the world size."""

from dataclasses import dataclass


@dataclass
class ParallelDims:
    dp_replicate: int
    dp_shard: int
    """-1 takes whatever world size the other degrees leave."""
    cp: int
    tp: int
    pp: int
    world_size: int

    def __post_init__(self):
        for name in ("dp_replicate", "cp", "tp", "pp"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        others = self.dp_replicate * self.cp * self.tp * self.pp
        if self.dp_shard == -1:
            if self.world_size % others:
                raise ValueError(
                    f"world size {self.world_size} is not divisible by dp_replicate={self.dp_replicate} x "
                    f"cp={self.cp} x tp={self.tp} x pp={self.pp} = {others}, so dp_shard=-1 has no whole value"
                )
            self.dp_shard = self.world_size // others
        if self.dp_shard < 1:
            raise ValueError(f"dp_shard={self.dp_shard} must be >= 1, or -1 for the rest of the world")
        product = others * self.dp_shard
        if product != self.world_size:
            raise ValueError(
                f"dp_replicate={self.dp_replicate} x dp_shard={self.dp_shard} x cp={self.cp} x tp={self.tp} x "
                f"pp={self.pp} = {product}, but the world size is {self.world_size}; the product must equal it"
            )

    @property
    def dp(self) -> int:
        """Ranks that see different data."""
        return self.dp_replicate * self.dp_shard

    def describe(self) -> str:
        parts = [f"{k} {getattr(self, k)}" for k in ("dp_replicate", "dp_shard", "cp", "tp", "pp")]
        return f"world {self.world_size} = " + " x ".join(parts)
