"""The acceptance rules' plug-in interface (speculative/decoding/acceptance/): the registry says
what each rule supports, DecodeConfig and the jobs ask it, and `acceptance.verify` is one call for
chains and trees that returns what the rule's own function returns."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import decoding
from speculative.decoding import TreeShape, acceptance
from speculative.decoding.acceptance import ChainRound, Rule, Support, TreeRound
from speculative.decoding.acceptance import block as block_rule
from speculative.decoding.acceptance import token as token_rule
from speculative.decoding.acceptance import tree as tree_rule
from speculative.decoding.sampling import SamplingConfig
from speculative.errors import JobError
from speculative.jobs import config as job_config

T1 = SamplingConfig(temperature=1.0)


def test_registry_declares_what_each_rule_supports():
    assert acceptance.names() == ("token", "block", "traversal") == acceptance.NAMES
    assert acceptance.names(False) == ("token", "block")
    assert acceptance.names(True) == ("token", "traversal")
    assert acceptance.names(False, lenient=True) == ("token",)
    assert acceptance.names(True, lenient=True) == ()
    assert acceptance.names(False, adaptive=True) == ("token", "block")
    # The rules run these functions; the token rule's chain form hands its round to
    # `sampling.verify_detailed`.
    assert acceptance.rule("token").chain() is token_rule.verify_chain
    assert acceptance.rule("token").tree() is tree_rule.verify_tree
    assert acceptance.rule("block").chain() is block_rule.verify_block
    with pytest.raises(ValueError, match="a support needs its function"):
        Rule("half", "a support without its function", chains=Support())
    with pytest.raises(ValueError, match=r"acceptance must be one of \('token', 'block', 'trav"):
        acceptance.rule("blocks")


def test_config_and_jobs_ask_the_registry(monkeypatch):
    """A rule added to RULES is known by name, checked by what it supports, and listed in errors."""
    sampled_only = Rule(
        "sampled_only", "token verification, declared for temperature > 0 only",
        chains=Support(greedy=False), chain=lambda: token_rule.verify_chain,
    )  # fmt: skip
    monkeypatch.setitem(acceptance.RULES, "sampled_only", sampled_only)
    assert decoding.DecodeConfig(8, (1,), T1, gamma=2, acceptance="sampled_only").gamma == 2
    with pytest.raises(ValueError, match="does not verify at temperature 0.0"):
        decoding.DecodeConfig(8, (1,), gamma=2, acceptance="sampled_only")
    with pytest.raises(ValueError, match=r"lenience 0.5 is defined for \('token',\) only"):
        decoding.DecodeConfig(8, (1,), T1, gamma=2, lenience=0.5, acceptance="sampled_only")
    with pytest.raises(ValueError, match=r"must be one of \('token', 'traversal'\), got 'sampled"):
        decoding.DecodeConfig(8, (1,), T1, tree=(2, 1), acceptance="sampled_only")
    with pytest.raises(ValueError, match="'sampled_only'\\), got 'nope'"):
        decoding.DecodeConfig(8, (1,), T1, gamma=2, acceptance="nope")
    job_config.check_acceptance("sampled_only", 1.0)
    policy = decoding.GammaPolicy()
    assert job_config.speculation_spec(None, None, policy, 1.0, "sampled_only").tree is None
    with pytest.raises(JobError, match=r"'traversal' verifies token trees only: set TREE"):
        job_config.speculation_spec(None, None, policy, 1.0, "traversal")
    spec = job_config.speculation_spec(None, (2, 1), policy, 1.0, "traversal")
    assert spec.tree == TreeShape((0, 0, 1))
    with pytest.raises(JobError, match=r"LENIENCE 0.5 needs \('token',\)"):
        job_config.check_acceptance("sampled_only", 0.5)
    with pytest.raises(ValueError, match="verifies token trees only"):
        decoding.DecodeConfig(8, (1,), T1, gamma=2, acceptance="traversal")
    fixed = Rule(
        "fixed", "fixed lengths only", chains=Support(), chain=lambda: token_rule.verify_chain
    )
    monkeypatch.setitem(acceptance.RULES, "fixed", fixed)
    with pytest.raises(ValueError, match="verifies full chains only"):
        decoding.DecodeConfig(
            8,
            (1,),
            T1,
            gamma=2,
            acceptance="fixed",
            gamma_policy=decoding.GammaPolicy("confidence"),
        )


def _logits(key, shape):
    return jax.random.normal(key, shape) * 2.0


def test_one_call_for_chains_and_trees_returns_the_rules_own_outcome():
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    batch, gamma, vocab = 6, 3, 11
    target = _logits(keys[0], (batch, gamma + 1, vocab))
    draft = _logits(keys[1], (batch, gamma, vocab))
    tokens = jax.random.randint(keys[2], (batch, gamma), 0, vocab)
    proposed = jnp.array([3, 1, 2, 3, 3, 2])

    # verify and the rule's own function jitted together: one program per rule instead of
    # op-by-op eager dispatch (the outcomes compared are the two calls' own outputs).
    @functools.partial(jax.jit, static_argnums=0)
    def chain_both(name, key, target, draft, tokens, proposed):
        v = acceptance.verify(
            name, key, target, draft, tokens, proposed, sampling=T1, adaptive=True
        )
        round_ = ChainRound(target, draft, tokens, proposed)
        return v, acceptance.rule(name).chain()(key, round_, T1, 1.0)

    for name in ("token", "block"):
        v, (n, nxt, beta) = chain_both(name, keys[3], target, draft, tokens, proposed)
        for a, b in ((v.num_accepted, n), (v.next_token, nxt), (v.beta, beta)):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(v.path, np.tile(np.arange(1, gamma + 1), (batch, 1)))
        position = np.arange(gamma)[None, :]
        want = (position <= np.asarray(n)[:, None]) & (position < np.asarray(proposed)[:, None])
        np.testing.assert_array_equal(v.tested, want)

    tree = TreeShape.from_widths((3, 2, 1))
    target = _logits(keys[0], (batch, tree.size + 1, vocab))
    log_q = jax.nn.log_softmax(_logits(keys[1], (batch, tree.size, vocab)))
    tokens = jax.random.randint(keys[2], (batch, tree.size), 0, vocab)

    @functools.partial(jax.jit, static_argnums=0)
    def tree_both(name, key, target, log_q, tokens):  # a TreeRound is built inside jit
        proposed = jnp.full((batch,), 3)
        v = acceptance.verify(name, key, target, log_q, tokens, proposed, sampling=T1, tree=tree)
        round_ = TreeRound(target, log_q, tokens, tree.children, 3)
        return v, acceptance.rule(name).tree()(key, round_, T1)

    for name in ("token", "traversal"):
        v, own = tree_both(name, keys[3], target, log_q, tokens)
        for a, b in zip((v.path, v.num_accepted, v.next_token, v.beta, v.tested), own, strict=True):
            np.testing.assert_array_equal(a, b)
