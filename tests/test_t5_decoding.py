"""Speculative decoding with T5 target and draft: greedy equals plain decoding token for token;
sampled sequences follow the target's exact sequence distribution (chi-square)."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import decoding
from speculative.decoding import sampling
from tests import helpers

EOS = 1


@pytest.mark.parametrize("gamma", [3])
def test_greedy_speculative_equals_autoregressive(gamma):
    vocab = 48
    target, tp, draft, dp = helpers.tiny_t5_pair(vocab, seed=3)
    batch = helpers.encoder_batch(seed=gamma, batch=6, width=7, vocab=vocab)
    greedy = sampling.SamplingConfig(temperature=0.0)
    plain = decoding.autoregressive_decode(
        target, tp, batch, max_decode_len=12, sampling=greedy, eos_id=EOS
    )
    spec = decoding.speculative_decode(
        target, tp, draft, dp, batch, gamma=gamma, max_decode_len=12, sampling=greedy, eos_id=EOS
    )
    np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(plain.tokens))
    np.testing.assert_array_equal(np.asarray(spec.lengths), np.asarray(plain.lengths))
    # The check has teeth: the draft alone decodes differently, drafts were both accepted and
    # rejected, and rows stopped at different lengths or tokens.
    own = decoding.autoregressive_decode(
        draft, dp, batch, max_decode_len=12, sampling=greedy, eos_id=EOS
    )
    assert not np.array_equal(np.asarray(own.tokens), np.asarray(plain.tokens))
    accepted, drafted = np.asarray(spec.stats["accepted"]), np.asarray(spec.stats["drafted"])
    assert accepted.sum() > 0 and (accepted < drafted).any()
    assert len({tuple(r) for r in np.asarray(plain.tokens)}) > 1


def _sequence_probs(model, params, encoder_tokens, vocab, length, cfg):
    """Exact probability of every generated sequence (ending at EOS or after `length` tokens),
    by teacher-forcing every prefix of the sequence tree through the uncached forward pass: all
    vocab ** (length - 1) continuations in one compiled call (the decoder is causal: a row's logits
    after its first d tokens are the next-token distribution of that prefix)."""
    continuations = list(itertools.product(range(vocab), repeat=length - 1))
    dec = jnp.asarray([[0, *c] for c in continuations], jnp.int32)
    enc = jnp.broadcast_to(encoder_tokens, (len(continuations), encoder_tokens.shape[-1]))

    @jax.jit
    def next_token_logp(params, enc, dec):
        logits = model.forward(params, enc, dec)  # [R, length, V]
        return sampling.process_logits(logits.reshape(-1, vocab), cfg).reshape(logits.shape)

    next_probs = np.exp(np.asarray(next_token_logp(params, enc, dec), np.float64))
    return helpers.walk_sequence_tree(next_probs, length, vocab, EOS)


def test_sampling_matches_exact_target_distribution():
    vocab, length, rows = 6, 3, 8192
    target, tp, draft, dp = helpers.tiny_t5_pair(vocab, seed=11)
    cfg = sampling.SamplingConfig(temperature=1.0)
    encoder_tokens = jnp.asarray([[4, 2, 5, 3, EOS]], jnp.int32)
    batch = {"encoder_input_tokens": jnp.tile(encoder_tokens, (rows, 1))}
    out = decoding.speculative_decode(
        target,
        tp,
        draft,
        dp,
        batch,
        gamma=2,
        max_decode_len=length,
        sampling=cfg,
        eos_id=EOS,
        rng=jax.random.PRNGKey(5),
    )
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    samples = [tuple(int(t) for t in row[:n]) for row, n in zip(tokens, lengths)]

    target_probs = _sequence_probs(target, tp, encoder_tokens, vocab, length, cfg)
    draft_probs = _sequence_probs(draft, dp, encoder_tokens, vocab, length, cfg)
    assert abs(sum(target_probs.values()) - 1) < 1e-6 and len(target_probs) == 1 + 5 + 25 * 6
    assert helpers.chi_square_pvalue(samples, target_probs) > 1e-3
    # Negative control: the same samples and test reject the draft's own sequence distribution.
    assert helpers.chi_square_pvalue(samples, draft_probs) < 1e-6
    accepted, drafted = np.asarray(out.stats["accepted"]), np.asarray(out.stats["drafted"])
    assert 0 < accepted.sum() < drafted.sum()


def test_draft_with_other_vocabulary_is_refused():
    target, tp, _, _ = helpers.tiny_t5_pair(48, seed=0)
    other, op, _, _ = helpers.tiny_t5_pair(40, seed=0)
    batch = helpers.encoder_batch(seed=0, batch=2, width=4, vocab=40)
    with pytest.raises(ValueError, match="vocabularies differ in size: draft 40, target 48"):
        decoding.speculative_decode(
            target, tp, other, op, batch, gamma=2, max_decode_len=4, eos_id=EOS
        )
