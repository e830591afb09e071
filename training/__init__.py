"""Training for the verifier: data generation, LoRA fine-tuning, calibration, evaluation.

Each stage is one script (`python -m training.<stage> --help`). Nothing here imports
service code; the hand-off to serving is the adapter directory (`adapter_config.json`,
`adapter_model.safetensors`, `prompt.json`, `calibration.json`).
"""
