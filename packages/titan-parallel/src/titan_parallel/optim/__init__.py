"""Optimizers whose update needs more than each rank's shard: Muon orthogonalizes whole matrices."""
