"""Checkpoint loaders (no pickle). Each validates shapes against the model config with clear errors."""
