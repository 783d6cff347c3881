"""Data parallelism: FSDP2 / HSDP / DDP by torch's fully_shard and replicate, and SimpleFSDP (DTensor +
parametrization + compile).
"""
