"""Evaluation harness: run GSM8K/SVAMP items through the pipeline's modes and report."""
