"""Checkpoint loaders (no pickle). Each validates shapes against the model config with clear errors."""

from speculative.checkpoints import hf_gemma as hf_gemma  # registers the 'gemma' family
from speculative.checkpoints.gguf import load_gguf as load_gguf
from speculative.checkpoints.hf_decoder import hf_model as hf_model
from speculative.checkpoints.hf_decoder import load_hf_decoder as load_hf_decoder
from speculative.checkpoints.hf_t5 import load_hf_t5 as load_hf_t5
from speculative.checkpoints.t5x import load_t5x as load_t5x
