"""Reproducible performance measurements (run with `python -m svtagg.benchmarks`)."""
