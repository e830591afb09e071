"""Planner prompts, loaded as package data: a system prompt and GSM8K-train few-shot plans."""
