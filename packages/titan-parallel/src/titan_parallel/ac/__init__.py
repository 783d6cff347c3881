"""Activation checkpointing: whole-block, per-op selective, every N-th block, and auto (chosen to fit a memory
budget).
"""
