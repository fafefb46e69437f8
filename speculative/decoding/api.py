"""The public calls: `autoregressive_decode` and `speculative_decode` validate their inputs,
place them on a mesh (with a partitioner), run the jitted loop and check for NaN logits.

Both build a `DecodeConfig` and call `decode`, which runs either from a config already made (the
notebook's `Pair.generate` passes one made of its checked `SpeculationSpec`). Its pieces are what
every caller of the loops uses, so there is one implementation of each
(`measure.runner.Decoder` compiles the same call ahead of time and times it):
`resolve_drafter` (the draft as a `Drafter`, checked against the target and the tree once),
`validate_inputs` (a batch), `prepare` (a `LoopCall`: the loop, its placed params and static
settings, how to place a batch, and the NaN check) and `place_inputs`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax

from speculative.decoding.checks import check_finite, validate_batch
from speculative.decoding.config import DecodeConfig, GammaPolicy
from speculative.decoding.drafter import Drafter, check_tree
from speculative.decoding.loop import autoregressive_loop, speculative_loop
from speculative.decoding.model_drafter import as_drafter
from speculative.decoding.sampling import SamplingConfig
from speculative.decoding.spec import SpeculationSpec
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
    return decode(model, params, batch, config, rng=rng, partitioner=partitioner)


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
    spec = SpeculationSpec(gamma, tree, gamma_policy, lenience, acceptance)
    config = DecodeConfig.from_spec(spec, max_decode_len, eos_id, sampling)
    return decode(
        target, target_params, batch, config, draft=draft, draft_params=draft_params, rng=rng,
        partitioner=partitioner,
    )  # fmt: skip


def decode(
    model: LanguageModel,
    params: Any,
    batch: dict[str, jax.Array],
    config: DecodeConfig,
    *,
    draft: LanguageModel | Drafter | None = None,
    draft_params: Any = None,
    rng: jax.Array | None = None,
    partitioner: Any = None,
) -> DecodeOutput:
    """Decodes `batch` by a `DecodeConfig` already made (e.g. `DecodeConfig.from_spec`):
    speculatively with a draft (the config's speculation settings), plainly without one. What
    `autoregressive_decode` and `speculative_decode` run after building their config; validates,
    places (with a partitioner) and runs the jitted loop, and raises on NaN logits after it."""
    drafter = None
    if draft is not None:
        if config.spec is None:
            raise ValueError("a draft needs a config with gamma or a tree (DecodeConfig.spec)")
        drafter = resolve_drafter(model, draft, config)
    validate_inputs(model, batch, config, drafter)
    rng = jax.random.PRNGKey(0) if rng is None else rng
    call = prepare(model, params, config, drafter, draft_params, partitioner)
    return call.finish(call.loop(*call.arguments(batch, rng), **call.static))


def resolve_drafter(
    target: LanguageModel, draft: LanguageModel | Drafter, config: DecodeConfig
) -> Drafter:
    """`draft` as a `Drafter` (a LanguageModel as the paper's), checked against `target` and
    `config.tree` (a DecodeConfig's): done once per decoder, before any batch."""
    drafter = as_drafter(draft)
    drafter.check_target(target)
    check_tree(drafter, config.tree)
    return drafter


def validate_inputs(
    model: LanguageModel, batch: dict[str, jax.Array], config: DecodeConfig, drafter=None
) -> None:
    """Raises ValueError when `batch` cannot be decoded by `model` (and `drafter`, if given)."""
    validate_batch(model, batch, config)
    if drafter is not None:
        drafter.validate(batch, config)


@dataclasses.dataclass(frozen=True, eq=False)
class LoopCall:
    """One decode's jitted loop, ready for any batch: `loop(*arguments(batch, rng), **static)`.

    params: the loop's array arguments before the batch, placed on the partitioner's mesh (once):
      (target params,), or (target params, draft params) with a drafter. A loop compiled ahead
      from `arguments` takes (*params, *inputs(batch, rng)).
    static: the loop's static keywords (config, and the partitioner when there is one).
    """

    loop: Any
    model: LanguageModel
    drafter: Drafter | None
    params: tuple
    static: dict[str, Any]

    def inputs(self, batch: dict[str, jax.Array], rng: jax.Array) -> tuple:
        """(batch, rng) as the loop takes them: rows on 'data' and rng replicated on a mesh."""
        return place_inputs(self.static.get("partitioner"), batch, rng)

    def arguments(self, batch: dict[str, jax.Array], rng: jax.Array) -> tuple:
        """The loop's positional arguments for `batch` (validate it first)."""
        batch, rng = self.inputs(batch, rng)
        if self.drafter is None:
            return self.model, *self.params, batch, rng
        params, draft_params = self.params
        return self.model, params, self.drafter, draft_params, batch, rng

    def finish(self, out: DecodeOutput) -> DecodeOutput:
        """`out`, after the NaN check (raises `NaNLogitsError` naming the model that made them)."""
        return check_finite(out, "model" if self.drafter is None else "target")


def prepare(
    model: LanguageModel,
    params: Any,
    config: DecodeConfig,
    drafter: Drafter | None = None,
    draft_params: Any = None,
    partitioner: Any = None,
) -> LoopCall:
    """The `LoopCall` decoding by `config`: speculative with a drafter (`resolve_drafter`), else
    plain; params placed by the partitioner's rules when there is one."""
    static: dict[str, Any] = {"config": config}
    if partitioner is not None:  # unsharded: the loop's default, left out of the call
        static["partitioner"] = partitioner
        params = partitioner.place_params(model, params, "target")
        if drafter is not None:
            draft_params = drafter.place_params(partitioner, draft_params)
    if drafter is None:
        return LoopCall(autoregressive_loop, model, None, (params,), static)
    return LoopCall(speculative_loop, model, drafter, (params, draft_params), static)


def place_inputs(partitioner: Any, batch: dict[str, jax.Array], rng: jax.Array) -> tuple:
    """Batch rows on 'data', the rng replicated: the jitted loop gets committed, sharded inputs.
    Without a partitioner (None), (batch, rng) as they are."""
    if partitioner is None:
        return batch, rng
    return partitioner.place_batch(batch), jax.device_put(rng, partitioner.replicated())
