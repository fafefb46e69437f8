"""Turning token lists into the batches decoding expects."""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np


def decoder_batch(
    prompts: Sequence[Sequence[int]], pad_id: int = 0, pad_to: int | None = None
) -> dict[str, jnp.ndarray]:
    """Right-pads token lists: {"prompt": int32[B, P], "prompt_lengths": int32[B]}.

    P is the longest prompt, or pad_to when given (one static shape, one compilation, for many
    batches).
    """
    if not prompts:
        raise ValueError("no prompts given")
    empty = [i for i, p in enumerate(prompts) if len(p) == 0]
    if empty:
        raise ValueError(f"prompts {empty} are empty; every prompt needs at least one token")
    width = max(len(p) for p in prompts)
    if pad_to is not None:
        if pad_to < width:
            raise ValueError(f"a prompt has {width} tokens, more than pad_to={pad_to}")
        width = pad_to
    tokens = np.full((len(prompts), width), pad_id, np.int32)
    for row, ids in enumerate(prompts):
        tokens[row, : len(ids)] = ids
    lengths = np.asarray([len(p) for p in prompts], np.int32)
    return {"prompt": jnp.asarray(tokens), "prompt_lengths": jnp.asarray(lengths)}


def encoder_batch(inputs: Sequence[Sequence[int]]) -> dict[str, jnp.ndarray]:
    """Right-pads encoder inputs with 0 (T5's pad): {"encoder_input_tokens": int32[B, L]}."""
    if not inputs:
        raise ValueError("no inputs given")
    width = max(max(len(x) for x in inputs), 1)
    tokens = np.zeros((len(inputs), width), np.int32)
    for row, ids in enumerate(inputs):
        tokens[row, : len(ids)] = ids
    return {"encoder_input_tokens": jnp.asarray(tokens)}


def input_tokens(batch: dict[str, jnp.ndarray]) -> jnp.ndarray:
    """The batch's token array [B, W]: "encoder_input_tokens" (encoder-decoder) or "prompt"."""
    return batch["encoder_input_tokens"] if "encoder_input_tokens" in batch else batch["prompt"]
