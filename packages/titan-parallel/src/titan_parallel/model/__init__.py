"""The model as this rank runs it: the frozen Layout, the apply order (build_parallel_model -> ParallelModel),
regional compile, gradient clipping and what was applied, read back.
"""
