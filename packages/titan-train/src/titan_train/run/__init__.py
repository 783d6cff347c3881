"""One training run: the Trainer and what a run needs (process groups, checkpoints, optimizer, reporting, validation,
the run record).
"""
