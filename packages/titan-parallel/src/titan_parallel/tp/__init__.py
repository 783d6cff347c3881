"""Tensor and sequence parallelism: styles from a plan, loss parallel, async TP and its chunked ops, ChannelParallel."""
