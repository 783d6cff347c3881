"""The dry run (`--dry-run --world-size N`): one CPU process drives the real run (titan_train.run) on torch's
fake process group and fake tensors to predict each rank's memory and step time. It drives the run; the run
never imports it. The planner (titan_train.plan) builds on it.
"""
