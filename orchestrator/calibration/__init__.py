"""The answer-confidence calibrator artifacts (orchestrator.confidence)."""
