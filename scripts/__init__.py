"""Benchmarks, evaluations and set-up helpers.

The Python ones run as modules from the repository root, so the project's packages are
importable without touching `sys.path`: `python -m scripts.bench_planner --help`.
"""
