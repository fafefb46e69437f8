"""Mutation check: the exactness tests fail on a wrong acceptance rule.

`speculative.decoding.sampling.verify_detailed` (the accept test, the residual and the bonus token of
Leviathan et al. 2023, Algorithm 1) is replaced by a copy with one deliberate error, everywhere the
package holds it (the decode loop reaches it through `decoding.acceptance`: the token rule's
`token.verify_chain` hands it its `ChainRound` and reads it when traced), JAX's caches
are cleared, and the same check functions the exactness tests run must raise AssertionError. The unmutated copy must first
equal the real rule bit for bit and pass the same checks, so a failure is the mutant's doing.

Mutant -> the named checks that catch it, and the assertion that fails (`CAUGHT_BY`, asserted):

- accept_all (every draft token accepted: the draft's q is emitted, not p):
    tests/test_sampling.py::check_verify_output_matches_target, `_pvalue(first, p1) > 1e-3`;
    tests/test_decoding.py::check_sampled_sequences_follow_target, the sequence chi-square
    `chi_square_pvalue(samples, exact) > 1e-3`.
- residual_unclamped (a rejection resamples from p - q renormalised, max(0, .) removed: its mass is
    ~0, so the draw falls back to p or divides rounding noise):
    check_verify_output_matches_target, `_pvalue(first, p1) > 1e-3`.
- residual_abs (from |p - q| renormalised: a valid distribution, but tokens where q > p get mass;
    the first token then follows (p + q) / 2):
    check_verify_output_matches_target, `_pvalue(first, p1) > 1e-3`.
  (check_sampled_sequences_follow_target's chi-square fails on both residual mutants too; it is
  left out for them to keep this module fast.)
- bonus_from_q (after all gamma drafts are accepted the extra token comes from the draft's q at the
    last draft position instead of the target's p_{gamma+1}):
    check_verify_output_matches_target, `_pvalue(next_token[n_acc == 1], p2) > 1e-3` (the bonus
    after an accepted draft). The sequence chi-square catches it too; like the residual mutants'
    it is left out, so the slower end-to-end check runs on accept_all only.
"""

from __future__ import annotations

import contextlib
import sys
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative.decoding import acceptance, sampling
from speculative.decoding.sampling import SamplingConfig
from tests.test_decoding import check_sampled_sequences_follow_target
from tests.test_sampling import check_verify_output_matches_target

MUTANTS = ["accept_all", "residual_unclamped", "residual_abs", "bonus_from_q"]
CFG = SamplingConfig(temperature=1.0)
GAMMA = 2  # check_sampled_sequences_follow_target's gamma: a bonus token needs both accepted


def mutated_verify_detailed(mutant: str | None):
    """`sampling.verify_detailed` (the exact rule, lenience included) with one error, or none."""

    def verify_detailed(
        rng, target_logits, draft_logits, draft_tokens, cfg, lenience=1.0, draft_lengths=None
    ):
        if cfg.greedy:
            return sampling.verify_greedy(target_logits, draft_logits, draft_tokens, draft_lengths)
        gamma = draft_tokens.shape[1]
        batch = draft_tokens.shape[0]
        p = jnp.exp(sampling.process_logits(target_logits, cfg))
        q = jnp.exp(sampling.process_logits(draft_logits, cfg))
        if lenience != 1.0:
            beta = jnp.sum(jnp.minimum(p[:, :gamma] / lenience, q), axis=-1)
            q = lenience * q
        else:
            beta = jnp.sum(jnp.minimum(p[:, :gamma], q), axis=-1)

        accept_rng, resample_rng = jax.random.split(rng)
        tokens = draft_tokens[..., None]
        p_x = jnp.take_along_axis(p[:, :gamma], tokens, axis=-1)[..., 0]
        q_x = jnp.take_along_axis(q, tokens, axis=-1)[..., 0]
        r = jax.random.uniform(accept_rng, (batch, gamma), dtype=jnp.float32)
        accepted = r * q_x < p_x
        if mutant == "accept_all":
            accepted = jnp.ones_like(accepted)
        if draft_lengths is not None:
            accepted &= jnp.arange(gamma)[None, :] < draft_lengths[:, None]
        num_accepted = jnp.sum(jnp.cumprod(accepted.astype(jnp.int32), axis=1), axis=1)

        rows = jnp.arange(batch)
        p_next = p[rows, num_accepted]
        if gamma:
            q_last = q[rows, jnp.minimum(num_accepted, gamma - 1)]
            proposed = gamma if draft_lengths is None else draft_lengths
            all_accepted = (num_accepted >= proposed)[:, None]
            q_next = jnp.where(all_accepted, 0.0, q_last)
        else:
            q_last = all_accepted = None
            q_next = jnp.zeros_like(p_next)
        if mutant == "residual_unclamped":
            residual = p_next - q_next
        elif mutant == "residual_abs":
            residual = jnp.abs(p_next - q_next)
        else:
            residual = jnp.maximum(p_next - q_next, 0.0)
        mass = jnp.sum(residual, axis=-1, keepdims=True)
        next_dist = jnp.where(mass > 0, residual / jnp.where(mass > 0, mass, 1.0), p_next)
        if mutant == "bonus_from_q" and gamma:
            next_dist = jnp.where(all_accepted, q_last, next_dist)
        next_token = sampling.categorical(resample_rng, jnp.log(next_dist))
        return num_accepted.astype(jnp.int32), next_token, beta

    return verify_detailed


@contextlib.contextmanager
def replaced_everywhere(module, name: str, replacement):
    """Sets `module.name` and every `speculative*` module attribute bound to the same object (a
    `from module import name` elsewhere) to `replacement`, with JAX's caches cleared on the way in
    and out (jitted callers would otherwise rerun programs traced with the original)."""
    original = getattr(module, name)
    patched = []
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not mod_name.startswith("speculative"):
            continue
        for attr, value in list(vars(mod).items()):
            if value is original:
                patched.append((mod, attr))
    assert (module, name) in patched
    jax.clear_caches()
    try:
        for mod, attr in patched:
            setattr(mod, attr, replacement)
        yield [f"{mod.__name__}.{attr}" for mod, attr in patched]
    finally:
        for mod, attr in patched:
            setattr(mod, attr, original)
        jax.clear_caches()


CHECKS = {
    "check_verify_output_matches_target": lambda pair, exact: check_verify_output_matches_target(
        CFG
    ),
    "check_sampled_sequences_follow_target": lambda pair, exact: (
        check_sampled_sequences_follow_target(pair, exact, CFG, GAMMA, draft_power=False)
    ),
}
# The checks each mutant is run through, and the assertion it trips in each (the check's own line,
# a test of the distribution). The rule is the same code in and out of the decode loop, so only
# accept_all runs the slower sequence check too (it catches the others as well; module docstring).
VERIFY, SEQUENCES = "check_verify_output_matches_target", "check_sampled_sequences_follow_target"
CAUGHT_BY = {
    "accept_all": {VERIFY: "_pvalue(first, p1) > 1e-3", SEQUENCES: "chi_square_pvalue(samples"},
    "residual_unclamped": {VERIFY: "_pvalue(first, p1) > 1e-3"},
    "residual_abs": {VERIFY: "_pvalue(first, p1) > 1e-3"},
    "bonus_from_q": {VERIFY: "_pvalue(next_token[n_acc == 1], p2) > 1e-3"},
}


def test_unmutated_copy_is_the_real_rule():
    """The copy the mutants are made from equals the real rule bit for bit (sampled, top-k, greedy,
    adaptive lengths, lenience), so each mutant differs from the real rule by its one error."""
    rng = np.random.default_rng(0)
    target = jnp.asarray(rng.standard_normal((64, 4, 7)), jnp.float32)
    draft = jnp.asarray(rng.standard_normal((64, 3, 7)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, 7, (64, 3)), jnp.int32)
    lengths = jnp.asarray(rng.integers(1, 4, 64), jnp.int32)
    copy = mutated_verify_detailed(None)
    # Real rule and copy jitted together (cfg and lenience static, as in the decode loop): one
    # program per case, not op-by-op eager dispatch; each returns its own outputs.
    both = jax.jit(
        lambda *args: (sampling.verify_detailed(*args), copy(*args)), static_argnums=(4, 5)
    )
    for cfg, lenience, draft_lengths in [
        (CFG, 1.0, None),
        (SamplingConfig(temperature=0.7, top_k=4), 1.0, lengths),
        (CFG, 0.5, None),
        (SamplingConfig(), 1.0, lengths),
    ]:
        for seed in range(1):
            key = jax.random.PRNGKey(seed)
            args = (key, target, draft, tokens, cfg, lenience, draft_lengths)
            for a, b in zip(*both(*args), strict=True):
                np.testing.assert_array_equal(a, b)


def test_unmutated_rule_passes_the_checks(small_pair, small_target_probs):
    exact = small_target_probs(CFG)
    copy = mutated_verify_detailed(None)
    calls = []

    def spied(*args):
        calls.append(len(args))
        return copy(*args)

    with replaced_everywhere(sampling, "verify_detailed", spied):
        # The loop reaches the rule through decoding.acceptance: the token rule's chain form
        # (`token.verify_chain`) reads sampling.verify_detailed when it is traced.
        drafted = acceptance.ChainRound(
            jnp.zeros((1, 2, 5)), jnp.zeros((1, 1, 5)), jnp.zeros((1, 1), jnp.int32)
        )
        acceptance.rule("token").chain()(jax.random.PRNGKey(0), drafted, CFG, 1.0)
        assert calls, "the loop would not run the patched rule"
        for check in sorted(CHECKS):
            CHECKS[check](small_pair, exact)


@pytest.mark.parametrize("mutant", MUTANTS)
def test_mutant_is_caught(mutant, small_pair, small_target_probs):
    exact = small_target_probs(CFG)
    failed = {}
    with replaced_everywhere(sampling, "verify_detailed", mutated_verify_detailed(mutant)):
        for check in sorted(CAUGHT_BY[mutant]):
            with pytest.raises(AssertionError) as caught:
                CHECKS[check](small_pair, exact)
            failed[check] = traceback.extract_tb(caught.tb)[-1]
    # Failed by the check's own distribution test, not by something on the way there.
    for check, frame in failed.items():
        assert frame.name == check and CAUGHT_BY[mutant][check] in frame.line, frame
