"""Wall-clock measurement helpers: compile time apart, medians over repeats, one host sync per run."""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from speculative.data import inputs
from speculative.decoding import acceptance
from speculative.decoding import sampling as sampling_lib
from speculative.models import precision


def block(tree: Any) -> Any:
    """Waits for every array in a pytree (JAX dispatch is asynchronous)."""
    return jax.block_until_ready(tree)


def compile_ahead(jitted: Any, *args: Any, **static: Any) -> tuple[Any, float]:
    """`jitted.lower(*args, **static).compile()` and the seconds it took (reported apart from every
    timed run). The compiled executable takes the non-static arguments only."""
    start = time.perf_counter()
    compiled = jitted.lower(*args, **static).compile()
    return compiled, time.perf_counter() - start


def time_call(fn: Callable[[], Any], repeats: int = 3) -> tuple[float, float, Any]:
    """Times fn() after one warm-up call.

    Returns:
      (first_call_seconds (compile + run), median_seconds over `repeats` warm calls, last result).
    """
    start = time.perf_counter()
    result = block(fn())
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = block(fn())
        times.append(time.perf_counter() - start)
    return first, statistics.median(times), result


def step_time(
    step: Callable[[Any, Any], Any],
    operands: Any,
    carry: Any,
    steps: int,
    repeats: int = 3,
    compiler_options: dict | None = None,
) -> float:
    """Median seconds per iteration of `carry = step(operands, carry)` run `steps` times in one jit.

    Running the steps in a `lax.fori_loop` keeps dispatch overhead out of the per-step time.
    `operands` (e.g. the params) are jit arguments, never closed over: closed-over arrays would be
    baked into the program as constants (gigabytes for a real model).
    compiler_options: XLA options of the timed program; None: the decode loops' own
    (`precision.COMPILER_OPTIONS`), so a step is timed as it runs.
    """
    if compiler_options is None:
        compiler_options = precision.COMPILER_OPTIONS

    @functools.partial(jax.jit, compiler_options=compiler_options)
    def many(operands, carry):
        return jax.lax.fori_loop(0, steps, lambda _, c: step(operands, c), carry)

    _, median, _ = time_call(lambda: many(operands, carry), repeats)
    return median / steps


def decode_step_time(
    model: Any,
    params: Any,
    batch: dict,
    cache_len: int,
    repeats: int = 3,
    length: int = 1,
    ancestors: Any = None,
    compiler_options: dict | None = None,
) -> float:
    """Median seconds of one `extend` by `length` tokens, cache filled. length 1 is a plain decode
    step; length gamma+1 is a speculative verify call.

    A decoder-only model is prefilled with `batch["prompt"]` [B, P]. An encoder-decoder's state
    reads the encoder tokens of `batch`, and its decoder starts from its start token, [B, 1].
    Rewinds the index by `length` each step so the cache fill, and hence the cost, stays constant.
    ancestors: a token tree's [N + 1, N + 1] ancestor matrix (`TreeShape.ancestors`): the tree
    verify call of that tree instead (length is then its size). compiler_options: as `step_time`.
    """
    if ancestors is not None:
        length = ancestors.shape[0]
    if model.is_encoder_decoder:
        rows = inputs.input_tokens(batch).shape[0]
        batch = {**batch, "prompt": jnp.full((rows, 1), model.decoder_start_id, jnp.int32)}

    @functools.partial(jax.jit, compiler_options=precision.COMPILER_OPTIONS)
    def prefill(params, batch):
        state = model.init_state(params, batch, cache_len)
        return model.extend(params, state, batch["prompt"])[1]

    state = prefill(params, batch)
    tokens = jnp.tile(batch["prompt"][:, -1:], (1, length))

    def step(params, carry):
        state, tokens = carry
        state = state.replace(index=state.index - length)
        logits, state = model.extend(params, state, tokens, ancestors)
        return state, jnp.argmax(logits, -1).astype(jnp.int32)

    return step_time(step, params, (state, tokens), 8, repeats, compiler_options)


def draft_propose_time(
    drafter: Any, params: Any, batch: dict, cache_len: int, config: Any, repeats: int = 3
) -> float:
    """Median seconds per proposed token of `drafter.propose` for config.gamma tokens on `batch`
    (a decoder-only prompt [B, P] or encoder inputs), in a jitted loop: the draft step time of a
    draft that is not a separate model (c of an n-gram or prompt-lookup draft is about 0)."""
    from speculative.decoding.drafter import (  # timing stays importable without drafts
        DraftContext,
        DraftRequest,
    )

    gamma = config.gamma
    prompt = inputs.input_tokens(batch)
    rows = prompt.shape[0]
    lengths = batch.get("prompt_lengths", jnp.sum(prompt != 0, axis=1)).astype(jnp.int32)
    last = prompt[jnp.arange(rows), jnp.maximum(lengths - 1, 0)].astype(jnp.int32)
    context = DraftContext(
        pos=jnp.maximum(lengths - 1, 0),
        last=last,
        prev=last,
        tokens=jnp.zeros((rows, config.max_decode_len + gamma + 1), jnp.int32),
        lengths=jnp.zeros(rows, jnp.int32),
        prompt=prompt.astype(jnp.int32),
        prompt_lengths=lengths,
        done=jnp.zeros(rows, bool),
        budget=jnp.full(rows, gamma, jnp.int32),
    )
    state = jax.jit(drafter.init, static_argnums=2)(params, batch, config)

    reads = drafter.reads_target_features

    def step(params, carry):
        state, rng = carry
        rng, key = jax.random.split(rng)
        if reads:  # a round also hands it the target's states of the kept path (gamma + 1)
            width = (rows, gamma + 1)
            features = jnp.zeros((*width, drafter.feature_width), jnp.float32)
            state = drafter.observe_target(
                params, state, features, jnp.zeros(width, jnp.int32), context.pos,
                jnp.full((rows,), gamma + 1, jnp.int32),
            )  # fmt: skip
        request = DraftRequest(context, key, config.sampling, gamma)
        tokens, _, state = drafter.propose(params, state, request)
        # The proposal feeds the next step: a drafter whose state does not change in propose
        # (it is rewritten by the next observe) would otherwise have its steps optimised away.
        return state, jax.random.fold_in(rng, jnp.sum(tokens))

    seconds = step_time(step, params, (state, jax.random.PRNGKey(0)), steps=8, repeats=repeats)
    return seconds / gamma


def read_bandwidth(rows: int = 16384, cols: int = 8192, repeats: int = 10) -> float:
    """Bytes per second XLA:CPU streams a weight in a one-row product (a GEMV over an output-major
    [rows, cols] float32 matrix, 512 MiB by default).

    A batch-1 decode step must read every weight once, so weight bytes / this is its floor. A GEMV
    over a matrix much larger than the last-level cache is the bound to compare with: a jitted sum
    over the same bytes under-reads it (~22 against ~28 GB/s on this 2-core VM), and a matrix that
    fits in cache over-reads it (docs/benchmarks.md).
    """
    weight = jnp.full((rows, cols), 0.5, jnp.float32)
    x = jnp.ones((1, cols), jnp.float32)
    gemv = jax.jit(lambda x, w: jnp.einsum("mk,nk->mn", x, w))
    _, median, _ = time_call(lambda: gemv(x, weight), repeats)
    return weight.nbytes / median


def sampling_round_time(
    batch_size: int,
    vocab_size: int,
    gamma: int,
    sampling: Any,
    acceptance_rule: str = "token",
    tree: Any = None,
    lenience: float = 1.0,
    repeats: int = 5,
) -> float:
    """Median seconds of one speculative round's sampling work outside the models: the draft's
    samples from [B, V] logits (gamma of them; a `TreeShape` tree's nodes) and their verification
    by rule `acceptance_rule` on [B, N + 1, V] target logits, through `acceptance.verify` as the
    decode loop calls it, so each rule (and a tree's) is charged its own work."""
    nodes = gamma if tree is None else tree.size

    @jax.jit
    def round_sampling(rng, draft_logits, target_logits):
        rngs = jax.random.split(rng, nodes + 1)
        tokens = jnp.stack(
            [sampling_lib.sample(rngs[i], draft_logits[:, i], sampling)[0] for i in range(nodes)],
            axis=1,
        )
        # a tree's rule reads the log q each node was drawn from; a chain's the draft's logits
        q = draft_logits if tree is None else jax.nn.log_softmax(draft_logits, axis=-1)
        return acceptance.verify(
            acceptance_rule, rngs[-1], target_logits, q, tokens,
            sampling=sampling, lenience=lenience, tree=tree,
        )  # fmt: skip

    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    draft_logits = 3.0 * jax.random.normal(keys[0], (batch_size, nodes, vocab_size), jnp.float32)
    target_logits = 3.0 * jax.random.normal(keys[1], (batch_size, nodes + 1, vocab_size))
    rng = jax.random.PRNGKey(1)
    _, median, _ = time_call(lambda: round_sampling(rng, draft_logits, target_logits), repeats)
    return median


def verify_tokens(gamma: int) -> int:
    """Tokens the target scores in one verify call of a gamma-token round (`DecodeConfig.block`):
    the costs' "target_extend_s" are keyed by these."""
    return gamma + 1


def verify_gamma(tokens: int) -> int:
    """The gamma whose verify call scores `tokens` tokens (the inverse of `verify_tokens`)."""
    return tokens - 1


def target_costs(
    target: Any, params: Any, batch: dict, cache_len: int, verify_lengths: Sequence[int] = ()
) -> dict[str, Any]:
    """The target's side of the costs on `batch`: {"target_step_s": one single-token step}, and
    with verify_lengths {"target_extend_s": {length: seconds of an extend by that many tokens}}
    (`verify_tokens(gamma)` is one verify call). Timed once per batch size, whatever the drafts."""
    result: dict[str, Any] = {"target_step_s": decode_step_time(target, params, batch, cache_len)}
    if verify_lengths:
        result["target_extend_s"] = {
            n: decode_step_time(target, params, batch, cache_len, length=n) for n in verify_lengths
        }
    return result


def draft_step_time(
    draft: Any, params: Any, batch: dict, cache_len: int, draft_config: Any = None
) -> float:
    """Seconds of one draft step on `batch`: a draft model's single-token step, or for a `Drafter`
    that is not a model (n-gram, prompt lookup, layer skip) its `propose` per proposed token for
    draft_config.gamma tokens (`draft_propose_time`)."""
    from speculative.decoding.drafter import Drafter

    if isinstance(draft, Drafter):
        return draft_propose_time(draft, params, batch, cache_len, draft_config)
    return decode_step_time(draft, params, batch, cache_len)


def measure_c(
    target: Any,
    target_params: Any,
    draft: Any,
    draft_params: Any,
    batch: dict,
    cache_len: int,
    verify_lengths: Sequence[int] = (),
    draft_config: Any = None,
) -> dict[str, Any]:
    """Seconds of one single-token step of each model on `batch`, and c = draft / target
    (`target_costs` and `draft_step_time` together). With verify_lengths, also the target's
    `extend` by each of those lengths: {"target_extend_s": {length: seconds}}. Thm 3.8 assumes
    these cost one step."""
    target_side = target_costs(target, target_params, batch, cache_len, verify_lengths)
    t_draft = draft_step_time(draft, draft_params, batch, cache_len, draft_config)
    step = target_side.pop("target_step_s")
    return {"target_step_s": step, "draft_step_s": t_draft, "c": t_draft / step, **target_side}
