"""Expert parallelism: routed experts split over ranks, their rows moved by all-to-all."""
