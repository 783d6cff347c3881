"""Context parallelism: the sequence sharded over the cp ranks, attention run as ring attention and linear
attention (Gated DeltaNet) with its recurrent state handed across ranks."""
