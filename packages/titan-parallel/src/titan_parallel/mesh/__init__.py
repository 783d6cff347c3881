"""The device and backend a run uses, the parallel degrees and the named device mesh."""
