"""Context parallelism: the sequence sharded over the cp ranks and attention run as ring attention."""
