"""The dry run: one CPU process drives the real run (titan_train.run) on torch's fake process group and fake tensors
to predict each rank's memory. It drives the run; the run never imports it.
"""
