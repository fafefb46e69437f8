"""Host-side checks around the jitted loops: can this pair / batch be decoded, and did a model
produce NaN logits (one check after the loop, never inside it)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from speculative.decoding.config import DecodeConfig
from speculative.decoding.state import DecodeOutput
from speculative.models.base import LanguageModel


def check_pair(target: LanguageModel, draft: LanguageModel) -> None:
    """Raises ValueError unless the draft can propose tokens for the target."""
    if draft.vocab_size != target.vocab_size:
        raise ValueError(
            f"draft and target vocabularies differ in size: draft {draft.vocab_size}, "
            f"target {target.vocab_size}"
        )
    if draft.is_encoder_decoder != target.is_encoder_decoder:
        raise ValueError("draft and target must both be decoder-only or both encoder-decoder")


def validate_batch(model: LanguageModel, batch: dict[str, jax.Array], config: DecodeConfig) -> None:
    """Raises ValueError naming what is wrong when `batch` cannot be decoded by `model`."""
    limit = model.max_length
    if model.is_encoder_decoder:
        if "encoder_input_tokens" not in batch:
            raise ValueError("encoder-decoder models need batch['encoder_input_tokens'] [B, L]")
        if limit is not None and config.max_decode_len + config.block > limit:
            raise ValueError(
                f"max_decode_len {config.max_decode_len} exceeds the model limit {limit}"
            )
        return
    if "prompt" not in batch or "prompt_lengths" not in batch:
        raise ValueError(
            "decoder-only models need batch['prompt'] [B, P] and ['prompt_lengths'] [B]"
        )
    prompt, lengths = batch["prompt"], to_host(batch["prompt_lengths"])
    if prompt.ndim != 2 or lengths.shape != (prompt.shape[0],):
        raise ValueError(
            f"prompt must be [B, P] and prompt_lengths [B]; got {prompt.shape} and {lengths.shape}"
        )
    if np.any(lengths < 1) or np.any(lengths > prompt.shape[1]):
        raise ValueError(
            f"prompt_lengths must be in 1..{prompt.shape[1]} (the padded prompt width); "
            f"got {lengths.tolist()}"
        )
    needed = int(lengths.max()) + config.max_decode_len
    if limit is not None and needed > limit:
        raise ValueError(
            f"prompt ({int(lengths.max())} tokens) + max_decode_len ({config.max_decode_len}) = "
            f"{needed} is longer than the model context / cache limit max_seq_len={limit}"
        )


class NaNLogitsError(FloatingPointError):
    """A model produced NaN logits. role: "target", "draft" or "model"; rows: the batch rows."""

    def __init__(self, role: str, rows: list[int]):
        self.role, self.rows = role, rows
        super().__init__(
            f"the {role} produced NaN logits for batch rows {rows}; check the checkpoint "
            "(corrupt weights) or use float32 instead of a low-precision dtype"
        )


def check_finite(out: DecodeOutput, which: str) -> DecodeOutput:
    """Raises NaNLogitsError (a FloatingPointError) on NaN logits of the target (named `which`) or
    of the draft: one host check after the loop (never inside it)."""
    for role, flags in ((which, out.stats.nan_logits), ("draft", out.stats.nan_draft_logits)):
        bad = to_host(flags)
        if bad.any():
            raise NaNLogitsError(role, np.flatnonzero(bad).tolist())
    return out


def to_host(x: Any) -> np.ndarray:
    """numpy value of a small array; a global array spread over several hosts is all-gathered."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)
