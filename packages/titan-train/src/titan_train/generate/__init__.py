"""Generation: a model and tokenizer from a checkpoint, and tokens streamed as they are generated."""
