"""Plain and speculative decoding: the whole decode loop lives in this file.

Both decoders are one jitted function around `lax.while_loop`; nothing returns to the host until the
batch is finished. Every row keeps its own position, acceptance count, EOS and length limit; shapes are
static (batch, cache length, gamma), finished rows keep computing but their results are masked.

Per-row loop state (B = batch, G = gamma):
    pos      [B]  absolute position of `last`, the newest token not yet fed to the target
    last     [B]  that token (the last prompt token, or T5's decoder start 0, at the beginning)
    prev     [B]  the token at pos - 1 (draft catch-up, DESIGN.md section 2)
    lengths  [B]  generated tokens so far;  done [B]: EOS emitted or max_decode_len reached
    tokens   [B, max_decode_len + G + 1] output buffer (slack for a whole block past the limit)

One speculative round (`_speculative_round`):
  1. draft: rewind to pos - 1, feed [prev, last] (re-caches prev when the previous round accepted all
     G tokens), then G - 1 single-token steps: x_1..x_G ~ q_1..q_G.
  2. target: one call on [last, x_1..x_G] at pos -> p_1..p_{G+1}.
  3. `sampling.verify_detailed`: n accepted, next token; emit x_1..x_n, next; target index -> pos+n+1.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

from speculative import inputs
from speculative.models.base import DecodeState, LanguageModel, write_rows
from speculative.sampling import SamplingConfig, sample, verify_detailed


@flax.struct.dataclass
class DecodeOutput:
    """Result of a decode.

    tokens: [B, max_decode_len] int32 generated tokens, EOS included, 0 after it.
    lengths: [B] int32 generated tokens per row (EOS included).
    stats: dict of per-row arrays, see `_finalise_stats`.
    """

    tokens: jax.Array
    lengths: jax.Array
    stats: dict[str, jax.Array]


# ------------------------------------------------------------------------------------------------
# Shared pieces: prefill, emitting a block of tokens.


def _prefill(
    model: LanguageModel, params: Any, batch: dict[str, jax.Array], cache_len: int
) -> tuple[DecodeState, jax.Array, jax.Array, jax.Array]:
    """Builds the initial state: (state, pos [B], last [B], prev [B]).

    Decoder-only: the whole right-padded prompt is written once; the last prompt token becomes `last`
    (its cache slot is rewritten by the first round). Encoder-decoder: encode, start from token 0.
    """
    state = model.init_state(params, batch, cache_len)
    if model.is_encoder_decoder:
        zeros = jnp.zeros((_batch_size(batch),), jnp.int32)
        return state.replace(index=zeros), zeros, zeros, zeros
    prompt = batch["prompt"].astype(jnp.int32)
    _, state = model.extend(params, state, prompt)  # logits unused: XLA drops the projection
    pos = batch["prompt_lengths"].astype(jnp.int32) - 1
    last = jnp.take_along_axis(prompt, pos[:, None], axis=1)[:, 0]
    prev = jnp.take_along_axis(prompt, jnp.maximum(pos - 1, 0)[:, None], axis=1)[:, 0]
    return state.replace(index=pos), pos, last, prev


def _emit(
    out_tokens: jax.Array,
    lengths: jax.Array,
    done: jax.Array,
    block: jax.Array,
    count: jax.Array,
    eos_id: int | Sequence[int],
    max_decode_len: int,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Appends the first count[b] tokens of block[b] to each active row, stopping at EOS / the limit.

    Args:
      out_tokens: [B, T + slack] buffer; lengths [B]; done [B] bool.
      block: [B, K] candidate tokens; count [B] how many of them the round produced (1..K).
    Returns:
      (out_tokens, lengths, done, emitted [B]) after the append.
    """
    width = block.shape[1]
    in_block = jnp.arange(width)[None, :] < count[:, None]
    is_eos = jnp.isin(block, jnp.asarray(eos_id, jnp.int32)) & in_block
    has_eos = jnp.any(is_eos, axis=1)
    count = jnp.where(has_eos, jnp.argmax(is_eos, axis=1) + 1, count)
    count = jnp.minimum(count, max_decode_len - lengths)
    count = jnp.where(done, 0, count)
    # Writing the whole block is safe: slots past the new length are overwritten or masked later.
    out_tokens = write_rows(out_tokens, block, jnp.where(done, max_decode_len, lengths))
    new_lengths = lengths + count
    done = done | has_eos | (new_lengths >= max_decode_len)
    return out_tokens, new_lengths, done, count


def _finish_tokens(out_tokens: jax.Array, lengths: jax.Array, max_decode_len: int) -> jax.Array:
    """[B, T + slack] buffer -> [B, T] with zeros after each row's length."""
    tokens = out_tokens[:, :max_decode_len]
    return jnp.where(jnp.arange(max_decode_len)[None, :] < lengths[:, None], tokens, 0)


def _has_nan(logits: jax.Array) -> jax.Array:
    """[B, L, V] -> [B] bool: any NaN logit in the row."""
    return jnp.any(jnp.isnan(logits), axis=(1, 2))


# ------------------------------------------------------------------------------------------------
# Plain autoregressive decoding (the baseline).


@functools.partial(
    jax.jit, static_argnames=("model", "max_decode_len", "sampling", "eos_id", "partitioner")
)
def _autoregressive_jit(
    model, params, batch, rng, *, max_decode_len, sampling, eos_id, partitioner=None
):
    size = _batch_size(batch)
    cache_len = _cache_len(model, batch, max_decode_len, block=1)
    state, pos, last, _ = _prefill(model, params, batch, cache_len)
    state = _constrain_state(partitioner, model, state, "target")
    carry = {
        "state": state,
        "pos": pos,
        "last": last,
        "rng": rng,
        "tokens": jnp.zeros((size, max_decode_len + 1), jnp.int32),
        "lengths": jnp.zeros((size,), jnp.int32),
        "done": jnp.zeros((size,), jnp.bool_),
        "target_calls": jnp.zeros((size,), jnp.int32),
        "nan": jnp.zeros((size,), jnp.bool_),
    }

    def step(c):
        active = ~c["done"]
        rng, step_rng = jax.random.split(c["rng"])
        logits, state = model.extend(params, c["state"].replace(index=c["pos"]), c["last"][:, None])
        state = _constrain_state(partitioner, model, state, "target")
        token, _ = sample(step_rng, logits[:, 0], sampling)
        tokens, lengths, done, emitted = _emit(
            c["tokens"],
            c["lengths"],
            c["done"],
            token[:, None],
            jnp.ones_like(token),
            eos_id,
            max_decode_len,
        )
        return {
            "state": state,
            "pos": c["pos"] + emitted,
            "last": jnp.where(active, token, c["last"]),
            "rng": rng,
            "tokens": tokens,
            "lengths": lengths,
            "done": done,
            "target_calls": c["target_calls"] + active,
            "nan": c["nan"] | (active & _has_nan(logits)),
        }

    c = jax.lax.while_loop(lambda c: ~jnp.all(c["done"]), step, carry)
    stats = {
        "target_calls": c["target_calls"],
        "tokens_per_call": c["lengths"] / jnp.maximum(c["target_calls"], 1),
        "nan_logits": c["nan"],
    }
    out = DecodeOutput(
        _finish_tokens(c["tokens"], c["lengths"], max_decode_len), c["lengths"], stats
    )
    return out if partitioner is None else partitioner.constrain_rows(out)


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
      DecodeOutput with tokens [B, max_decode_len], lengths [B], stats {target_calls,
      tokens_per_call}.
    """
    args, static = _autoregressive_args(
        model, params, batch, max_decode_len, sampling, eos_id, rng, partitioner
    )
    return _checked(_autoregressive_jit(*args, **static), "model")


def compile_autoregressive(
    model: LanguageModel,
    params: Any,
    batch: dict[str, jax.Array],
    *,
    max_decode_len: int,
    sampling: SamplingConfig = SamplingConfig(),
    eos_id: int | Sequence[int],
    rng: jax.Array | None = None,
    partitioner: Any = None,
) -> tuple[Callable[..., DecodeOutput], float]:
    """Ahead-of-time compiled `autoregressive_decode`: (run() -> DecodeOutput, compile seconds).

    run(batch=None, rng=None) reruns the same executable on another batch of identical shapes.

    For benchmarks: compile time is measured apart from every timed run.
    """
    args, static = _autoregressive_args(
        model, params, batch, max_decode_len, sampling, eos_id, rng, partitioner
    )
    return _compile(_autoregressive_jit, args, static, static_positions=(0,), which="model")


def _autoregressive_args(
    model, params, batch, max_decode_len, sampling, eos_id, rng, partitioner=None
):
    _validate(model, batch, max_decode_len, sampling, block=1)
    rng = jax.random.PRNGKey(0) if rng is None else rng
    static = dict(max_decode_len=int(max_decode_len), sampling=sampling, eos_id=_stop_ids(eos_id))
    if partitioner is not None:
        static["partitioner"] = partitioner
        params = partitioner.place_params(model, params, "target")
        batch, rng = _place_inputs(partitioner, batch, rng)
    return (model, params, batch, rng), static


# ------------------------------------------------------------------------------------------------
# Speculative decoding.


def _draft_block(draft, params, state, pos, last, prev, rng, gamma, sampling):
    """Proposes gamma tokens per row.

    Returns:
      (tokens [B, G] int32, logits [B, G, V] float32, draft state with index pos + G).
    """
    # Catch-up block [prev, last] at pos - 1; rows at position 0 (nothing before `last`) feed
    # [last, last] at 0 and read the first logits (the duplicate at slot 1 is overwritten next).
    start = jnp.maximum(pos - 1, 0)
    first = jnp.where(pos > 0, prev, last)
    logits2, state = draft.extend(params, state.replace(index=start), jnp.stack([first, last], 1))
    logits = jnp.take_along_axis(logits2, (pos - start)[:, None, None], axis=1)[:, 0]
    state = state.replace(index=pos + 1)
    rngs = jax.random.split(rng, gamma)
    token, _ = sample(rngs[0], logits, sampling)

    def step(carry, step_rng):
        state, token = carry
        logits, state = draft.extend(params, state, token[:, None])
        next_token, _ = sample(step_rng, logits[:, 0], sampling)
        return (state, next_token), (next_token, logits[:, 0])

    (state, _), (tokens, rest) = jax.lax.scan(step, (state, token), rngs[1:])
    tokens = jnp.concatenate([token[:, None], tokens.T], axis=1)
    all_logits = jnp.concatenate([logits[:, None], jnp.swapaxes(rest, 0, 1)], axis=1)
    return tokens, all_logits, state


def _speculative_round(
    c, *, target, target_params, draft, draft_params, gamma, sampling, eos_id, max_decode_len
):
    """One draft-verify-emit round over the whole batch; inactive rows are left unchanged."""
    active = ~c["done"]
    pos, last = c["pos"], c["last"]
    rng, draft_rng, verify_rng = jax.random.split(c["rng"], 3)
    draft_tokens, draft_logits, draft_state = _draft_block(
        draft, draft_params, c["draft_state"], pos, last, c["prev"], draft_rng, gamma, sampling
    )
    block = jnp.concatenate([last[:, None], draft_tokens], axis=1)  # [B, G+1]
    target_logits, target_state = target.extend(
        target_params, c["target_state"].replace(index=pos), block
    )
    n, next_token, beta = verify_detailed(
        verify_rng, target_logits, draft_logits, draft_tokens, sampling
    )

    # Emit x_1..x_n then next_token: put next_token at block position n.
    rows = jnp.arange(n.shape[0])
    emitted_block = jnp.concatenate([draft_tokens, jnp.zeros_like(last)[:, None]], axis=1)
    emitted_block = emitted_block.at[rows, n].set(next_token)
    tokens, lengths, done, emitted = _emit(
        c["tokens"], c["lengths"], c["done"], emitted_block, n + 1, eos_id, max_decode_len
    )

    new_pos = jnp.where(active, pos + n + 1, pos)
    prev_if_active = jnp.where(n > 0, draft_tokens[rows, jnp.maximum(n - 1, 0)], last)
    # Positions 1..min(n+1, G) were tested against the target; later ones were never looked at.
    verified = (jnp.arange(gamma)[None, :] <= n[:, None]) & active[:, None]
    accepted_at = (jnp.arange(gamma)[None, :] < n[:, None]) & active[:, None]
    s = c["stats"]
    stats = {
        "target_calls": s["target_calls"] + active,
        "draft_calls": s["draft_calls"] + gamma * active,
        "drafted": s["drafted"] + gamma * active,
        "accepted": s["accepted"] + jnp.where(active, n, 0),
        "emitted": s["emitted"] + emitted,
        "beta_sum": s["beta_sum"] + jnp.sum(jnp.where(verified, beta, 0.0), axis=1),
        "verified": s["verified"] + jnp.sum(verified, axis=1),
        "accepted_at": s["accepted_at"] + accepted_at,
        "verified_at": s["verified_at"] + verified,
        "nan_logits": s["nan_logits"] | (active & _has_nan(target_logits)),
    }
    return {
        "target_state": target_state.replace(index=new_pos),
        "draft_state": draft_state,
        "pos": new_pos,
        "last": jnp.where(active, next_token, last),
        "prev": jnp.where(active, prev_if_active, c["prev"]),
        "rng": rng,
        "tokens": tokens,
        "lengths": lengths,
        "done": done,
        "stats": stats,
    }


@functools.partial(
    jax.jit,
    static_argnames=(
        "target",
        "draft",
        "gamma",
        "max_decode_len",
        "sampling",
        "eos_id",
        "partitioner",
    ),
)
def _speculative_jit(
    target,
    target_params,
    draft,
    draft_params,
    batch,
    rng,
    *,
    gamma,
    max_decode_len,
    sampling,
    eos_id,
    partitioner=None,
):
    size = _batch_size(batch)
    block = gamma + 1
    target_state, pos, last, prev = _prefill(
        target, target_params, batch, _cache_len(target, batch, max_decode_len, block)
    )
    draft_state, _, _, _ = _prefill(
        draft, draft_params, batch, _cache_len(draft, batch, max_decode_len, block)
    )
    target_state = _constrain_state(partitioner, target, target_state, "target")
    draft_state = _constrain_state(partitioner, draft, draft_state, "draft")
    zeros = jnp.zeros((size,), jnp.int32)
    carry = {
        "target_state": target_state,
        "draft_state": draft_state,
        "pos": pos,
        "last": last,
        "prev": prev,
        "rng": rng,
        "tokens": jnp.zeros((size, max_decode_len + block), jnp.int32),
        "lengths": zeros,
        "done": jnp.zeros((size,), jnp.bool_),
        "stats": {
            "target_calls": zeros,
            "draft_calls": zeros,
            "drafted": zeros,
            "accepted": zeros,
            "emitted": zeros,
            "beta_sum": jnp.zeros((size,), jnp.float32),
            "verified": zeros,
            "accepted_at": jnp.zeros((size, gamma), jnp.int32),
            "verified_at": jnp.zeros((size, gamma), jnp.int32),
            "nan_logits": jnp.zeros((size,), jnp.bool_),
        },
    }
    round_fn = functools.partial(
        _speculative_round,
        target=target,
        target_params=target_params,
        draft=draft,
        draft_params=draft_params,
        gamma=gamma,
        sampling=sampling,
        eos_id=eos_id,
        max_decode_len=max_decode_len,
    )

    def body(c):
        c = round_fn(c)
        c["target_state"] = _constrain_state(partitioner, target, c["target_state"], "target")
        c["draft_state"] = _constrain_state(partitioner, draft, c["draft_state"], "draft")
        return c

    c = jax.lax.while_loop(lambda c: ~jnp.all(c["done"]), body, carry)
    s = c["stats"]
    stats = {
        "target_calls": s["target_calls"],
        "draft_calls": s["draft_calls"],
        "drafted": s["drafted"],
        "accepted": s["accepted"],
        "alpha": s["beta_sum"] / jnp.maximum(s["verified"], 1),
        "tokens_per_call": c["lengths"] / jnp.maximum(s["target_calls"], 1),
        "accepted_at": s["accepted_at"],
        "verified_at": s["verified_at"],
        "nan_logits": s["nan_logits"],
    }
    out = DecodeOutput(
        _finish_tokens(c["tokens"], c["lengths"], max_decode_len), c["lengths"], stats
    )
    return out if partitioner is None else partitioner.constrain_rows(out)


def speculative_decode(
    target: LanguageModel,
    target_params: Any,
    draft: LanguageModel,
    draft_params: Any,
    batch: dict[str, jax.Array],
    *,
    gamma: int,
    max_decode_len: int,
    sampling: SamplingConfig = SamplingConfig(),
    eos_id: int | Sequence[int],
    rng: jax.Array | None = None,
    partitioner: Any = None,
) -> DecodeOutput:
    """Exact speculative decoding: output distributed as `autoregressive_decode(target, ...)`.

    Args:
      target, draft: models sharing a vocabulary (same vocab_size; compare token lists with
        `vocab.check_compatible` when loading).
      batch: as for `autoregressive_decode`.
      gamma: draft tokens proposed per round (>= 1).
      partitioner: optional `partitioning.Partitioner`: run SPMD on its mesh, target and draft
        each sharded by their own rules (see `autoregressive_decode`).
    Returns:
      DecodeOutput. stats, per row: target_calls, draft_calls (a call = one draft forward step),
      drafted, accepted, alpha (mean of sum_x min(p, q) over verified positions), tokens_per_call
      (tau = generated tokens / target calls, prefill excluded), accepted_at / verified_at [B, G]
      (how often draft position i was accepted / tested).
    """
    args, static = _speculative_args(
        target,
        target_params,
        draft,
        draft_params,
        batch,
        gamma,
        max_decode_len,
        sampling,
        eos_id,
        rng,
        partitioner,
    )
    return _checked(_speculative_jit(*args, **static), "target")


def compile_speculative(
    target: LanguageModel,
    target_params: Any,
    draft: LanguageModel,
    draft_params: Any,
    batch: dict[str, jax.Array],
    *,
    gamma: int,
    max_decode_len: int,
    sampling: SamplingConfig = SamplingConfig(),
    eos_id: int | Sequence[int],
    rng: jax.Array | None = None,
    partitioner: Any = None,
) -> tuple[Callable[..., DecodeOutput], float]:
    """Ahead-of-time compiled `speculative_decode`: (run() -> DecodeOutput, compile seconds).

    run(batch=None, rng=None) reruns the same executable on another batch of identical shapes.
    """
    args, static = _speculative_args(
        target,
        target_params,
        draft,
        draft_params,
        batch,
        gamma,
        max_decode_len,
        sampling,
        eos_id,
        rng,
        partitioner,
    )
    return _compile(_speculative_jit, args, static, static_positions=(0, 2), which="target")


def _speculative_args(
    target,
    target_params,
    draft,
    draft_params,
    batch,
    gamma,
    max_decode_len,
    sampling,
    eos_id,
    rng,
    partitioner=None,
):
    if not isinstance(gamma, (int, np.integer)) or gamma < 1:
        raise ValueError(f"gamma must be an integer >= 1, got {gamma!r}")
    if draft.vocab_size != target.vocab_size:
        raise ValueError(
            f"draft and target vocabularies differ in size: draft {draft.vocab_size}, "
            f"target {target.vocab_size}"
        )
    if draft.is_encoder_decoder != target.is_encoder_decoder:
        raise ValueError("draft and target must both be decoder-only or both encoder-decoder")
    _validate(target, batch, max_decode_len, sampling, block=gamma + 1)
    _validate(draft, batch, max_decode_len, sampling, block=gamma + 1)
    rng = jax.random.PRNGKey(0) if rng is None else rng
    static = dict(
        gamma=int(gamma),
        max_decode_len=int(max_decode_len),
        sampling=sampling,
        eos_id=_stop_ids(eos_id),
    )
    if partitioner is not None:
        static["partitioner"] = partitioner
        target_params = partitioner.place_params(target, target_params, "target")
        draft_params = partitioner.place_params(draft, draft_params, "draft")
        batch, rng = _place_inputs(partitioner, batch, rng)
    return (target, target_params, draft, draft_params, batch, rng), static


def _constrain_state(partitioner, model, state, role):
    """Pins a decode state to its shardings (batch on 'data', heads as the rules say), so GSPMD
    keeps the cache split through the loop instead of choosing a layout of its own."""
    return state if partitioner is None else partitioner.constrain_state(model, state, role)


def _place_inputs(partitioner, batch, rng):
    """Batch rows on 'data', the rng replicated: the jitted loop gets committed, sharded inputs."""
    return partitioner.place_batch(batch), jax.device_put(rng, partitioner.replicated())


def _compile(jitted, args, static, static_positions, which):
    start = time.perf_counter()
    compiled = jitted.lower(*args, **static).compile()
    seconds = time.perf_counter() - start
    dynamic = [a for i, a in enumerate(args) if i not in static_positions]

    def run(batch=None, rng=None):
        """Runs the compiled decode; batch and rng (the last two arguments) may be replaced by
        arrays of the same shapes, e.g. the next chunk of a padded input set."""
        call = list(dynamic)
        if batch is not None:
            call[-2] = batch
        if rng is not None:
            call[-1] = rng
        return _checked(compiled(*call), which)

    return run, seconds


# ------------------------------------------------------------------------------------------------
# Validation and sizes.


def _stop_ids(eos_id) -> tuple[int, ...]:
    """A hashable (static) tuple of stop ids from an int or a sequence of ints."""
    ids = (eos_id,) if isinstance(eos_id, (int, np.integer)) else tuple(eos_id)
    if not ids or not all(isinstance(i, (int, np.integer)) for i in ids):
        raise ValueError(f"eos_id must be an int or a non-empty sequence of ints, got {eos_id!r}")
    return tuple(int(i) for i in ids)


def _batch_size(batch: dict[str, jax.Array]) -> int:
    return inputs.input_tokens(batch).shape[0]


def _cache_len(
    model: LanguageModel, batch: dict[str, jax.Array], max_decode_len: int, block: int
) -> int:
    """Static cache length: prompt + generated tokens + one block of slack for the last round."""
    prompt_len = 0 if model.is_encoder_decoder else batch["prompt"].shape[1]
    return prompt_len + max_decode_len + block


def _validate(model, batch, max_decode_len, sampling, block):
    if not isinstance(sampling, SamplingConfig):
        raise ValueError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}")
    if not isinstance(max_decode_len, (int, np.integer)) or max_decode_len < 1:
        raise ValueError(f"max_decode_len must be an integer >= 1, got {max_decode_len!r}")
    if model.is_encoder_decoder:
        if "encoder_input_tokens" not in batch:
            raise ValueError("encoder-decoder models need batch['encoder_input_tokens'] [B, L]")
        limit = getattr(model.config, "max_decode_len", None)
        if limit is not None and max_decode_len + block > limit:
            raise ValueError(f"max_decode_len {max_decode_len} exceeds the model limit {limit}")
        return
    if "prompt" not in batch or "prompt_lengths" not in batch:
        raise ValueError(
            "decoder-only models need batch['prompt'] [B, P] and ['prompt_lengths'] [B]"
        )
    prompt, lengths = batch["prompt"], _to_host(batch["prompt_lengths"])
    if prompt.ndim != 2 or lengths.shape != (prompt.shape[0],):
        raise ValueError(
            f"prompt must be [B, P] and prompt_lengths [B]; got {prompt.shape} and {lengths.shape}"
        )
    if np.any(lengths < 1) or np.any(lengths > prompt.shape[1]):
        raise ValueError(
            f"prompt_lengths must be in 1..{prompt.shape[1]} (the padded prompt width); "
            f"got {lengths.tolist()}"
        )
    context = model.config.max_seq_len
    needed = int(lengths.max()) + max_decode_len
    if needed > context:
        raise ValueError(
            f"prompt ({int(lengths.max())} tokens) + max_decode_len ({max_decode_len}) = {needed} "
            f"is longer than the model context / cache limit max_seq_len={context}"
        )


def _to_host(x: Any) -> np.ndarray:
    """numpy value of a small array; a global array spread over several hosts is all-gathered."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def _checked(out: DecodeOutput, which: str) -> DecodeOutput:
    """Raises on NaN logits: one host check after the loop (never inside it)."""
    bad = _to_host(out.stats["nan_logits"])
    if bad.any():
        raise FloatingPointError(
            f"the {which} produced NaN logits for batch rows {np.flatnonzero(bad).tolist()}; "
            "check the checkpoint (corrupt weights) or use float32 instead of a low-precision dtype"
        )
    return out
