"""The public calls: `autoregressive_decode` and `speculative_decode` validate their inputs,
place them on a mesh (with a partitioner), run the jitted loop and check for NaN logits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

from speculative.decoding.checks import check_finite, validate_batch
from speculative.decoding.config import DecodeConfig, GammaPolicy
from speculative.decoding.drafter import Drafter
from speculative.decoding.loop import autoregressive_loop, speculative_loop
from speculative.decoding.model_drafter import as_drafter
from speculative.decoding.sampling import SamplingConfig
from speculative.decoding.state import DecodeOutput
from speculative.decoding.tree import TreeShape
from speculative.models.base import LanguageModel


def autoregressive_decode(
    model: LanguageModel,
    params: Any,
    batch: dict[str, jax.Array],
    *,
    max_decode_len: int,
    sampling: SamplingConfig = SamplingConfig(),
    eos_id: int | Sequence[int],
    rng: jax.Array | None = None,
    partitioner: Any = None,
) -> DecodeOutput:
    """Plain decoding of `model`, one target call per token.

    Args:
      batch: {"prompt": int32[B, P], "prompt_lengths": int32[B]} (decoder-only, right-padded) or
        {"encoder_input_tokens": int32[B, L]} (encoder-decoder, 0 = pad).
      max_decode_len: tokens to generate at most per row.
      eos_id: a row stops after emitting it; a sequence of ids stops at any of them (e.g. Qwen's
        <|im_end|> and <|endoftext|>).
      partitioner: optional `partitioning.Partitioner`: run SPMD on its mesh (params, batch and
        cache sharded by its rules; outputs sharded by rows over 'data').
    Returns:
      DecodeOutput with tokens [B, max_decode_len], lengths [B] and per-row `DecodeStats`.
    """
    config = DecodeConfig(max_decode_len, eos_id, sampling)
    return _run(autoregressive_loop, model, params, None, None, batch, config, rng, partitioner)


def speculative_decode(
    target: LanguageModel,
    target_params: Any,
    draft: LanguageModel | Drafter,
    draft_params: Any,
    batch: dict[str, jax.Array],
    *,
    gamma: int | None = None,
    max_decode_len: int,
    eos_id: int | Sequence[int],
    sampling: SamplingConfig = SamplingConfig(),
    rng: jax.Array | None = None,
    partitioner: Any = None,
    lenience: float = 1.0,
    gamma_policy: GammaPolicy = GammaPolicy(),
    acceptance: str = "token",
    tree: TreeShape | tuple[int, ...] | None = None,
) -> DecodeOutput:
    """Exact speculative decoding: output distributed as `autoregressive_decode(target, ...)`.

    Args:
      target, draft: models sharing a vocabulary (same vocab_size; compare token lists with
        `vocab.check_compatible` when loading). draft may also be any `decoding.Drafter`
        (n-gram tables, prompt lookup, ...), with draft_params its arrays.
      batch: as for `autoregressive_decode`.
      gamma: draft tokens proposed per round (>= 1); with a tree, its depth (may be left unset).
      partitioner: optional `partitioning.Partitioner`: run SPMD on its mesh, target and draft
        each sharded by their own rules (see `autoregressive_decode`).
      lenience: 1 (exact, the default) or the paper's lossy lenient acceptance factor in (0, 1);
        the output's `exact` says which.
      gamma_policy: how many of the gamma slots each row drafts per round (`GammaPolicy`; default
        all of them).
      acceptance: 'token' (the paper's rule, the default), 'block' (block verification, chains:
        exact, and never fewer tokens accepted per round) or 'traversal' (traversal verification,
        trees: exact); `decoding.acceptance.RULES` says what each supports.
      tree: propose a token tree each round instead of a chain: a `TreeShape`, or its widths per
        depth such as (4, 2, 2, 1, 1) (`decoding.tree`); verified by the exact tree rule.
    Returns:
      DecodeOutput; its `DecodeStats` hold per row target_calls, draft_calls (a call = one draft
      forward step), drafted, accepted, alpha (mean of sum_x min(p, q) over verified positions),
      tokens_per_call (tau), accepted_at / verified_at [B, G] (G: per depth for a tree).
    """
    if gamma is None and tree is None:
        raise ValueError("speculative_decode needs gamma (>= 1) or a tree")
    config = DecodeConfig(
        max_decode_len, eos_id, sampling, gamma, lenience, gamma_policy, acceptance, tree
    )
    drafter = as_drafter(draft)
    drafter.check_target(target)
    return _run(
        speculative_loop, target, target_params, drafter, draft_params, batch, config, rng,
        partitioner,
    )  # fmt: skip


def _run(
    loop, model, params, drafter, draft_params, batch, config, rng, partitioner
) -> DecodeOutput:
    """Validates, places (with a partitioner) and runs a jitted loop; drafter None for plain
    decoding. Raises on NaN logits after the loop."""
    validate_batch(model, batch, config)
    if drafter is not None:
        drafter.validate(batch, config)
    rng = jax.random.PRNGKey(0) if rng is None else rng
    if partitioner is not None:
        params = partitioner.place_params(model, params, "target")
        if drafter is not None:
            draft_params = drafter.place_params(partitioner, draft_params)
        batch, rng = place_inputs(partitioner, batch, rng)
    if drafter is None:
        out = loop(model, params, batch, rng, config, partitioner)
    else:
        out = loop(model, params, drafter, draft_params, batch, rng, config, partitioner)
    return check_finite(out, "model" if drafter is None else "target")


def place_inputs(partitioner: Any, batch: dict[str, jax.Array], rng: jax.Array) -> tuple:
    """Batch rows on 'data', the rng replicated: the jitted loop gets committed, sharded inputs."""
    return partitioner.place_batch(batch), jax.device_put(rng, partitioner.replicated())
