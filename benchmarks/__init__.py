"""Benchmarks: ``python -m benchmarks`` (speed, see ``speed``); ``python benchmarks/dataset_memory.py``."""
