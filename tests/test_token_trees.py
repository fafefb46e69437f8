"""Token trees (decoding/tree.py, decoding/acceptance/tree.py, tree attention in models/base.py) are exact.

- Tree attention: one call scoring a tree gives every node the logits of its own path decoded
  causally (decoder-only and T5), and `keep_path` leaves a cache that continues like the path's.
- The tree rule alone: many rows of one round on a tiny vocabulary with context-dependent p and
  q (q with zero mass where p has mass, p with zeros too), siblings drawn without replacement by
  the real drafting code or fixed and colliding (a lookup draft), on a tree of first children and
  on a general tree; each row's output completed by the target is compared with the target's
  exact sequence distribution by chi-square. Two broken rules are caught by the same test.
- Decoding with a tree samples whole sequences from the target's exact distribution (T = 1,
  top-k, top-p; model, n-gram and prompt-lookup drafts) and greedy output equals plain decoding
  on ragged batches with EOS inside a tree, for depth 1 and large, decoder-only and T5.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import decoding
from speculative.decoding import acceptance
from speculative.decoding.acceptance import TreeRound
from speculative.decoding.acceptance import tree as tree_rule
from speculative.decoding.sampling import SamplingConfig
from speculative.decoding.tree import TreeShape, siblings
from speculative.drafts.ngram import NgramDrafter
from speculative.drafts.prompt_lookup import PromptLookupDrafter
from speculative.errors import JobError
from speculative.jobs import config as job_config
from speculative.models import base
from tests import helpers
from tests.test_decoding import check_sampled_sequences_follow_target

# ------------------------------------------------------------------------------------------------
# Shapes.


def test_tree_shapes_from_widths_and_parents():
    tree = TreeShape.from_widths((4, 2, 2, 1, 1))
    assert tree.parents == (0, 0, 0, 0, 1, 1, 5, 5, 7, 9)
    assert (tree.size, tree.depth, tree.widths) == (10, 5, (4, 2, 2, 1, 1))
    assert tree.first_child_chain
    assert tree.children[1].tolist()[:2] == [5, 6] and tree.children[2].tolist() == [-1] * 4
    assert tree.ancestors[10].nonzero()[0].tolist() == [0, 1, 5, 7, 9, 10]
    assert TreeShape.from_widths((1, 1, 1)).parents == (0, 1, 2)  # a chain
    general = TreeShape((0, 0, 1, 2, 2))
    assert not general.first_child_chain and general.depth == 2
    assert TreeShape.parse({"parents": (0, 0, 1)}) == TreeShape((0, 0, 1))
    assert TreeShape.parse((2, 1)) == TreeShape.from_widths((2, 1))
    for bad, match in [
        (lambda: TreeShape((0, 2)), "parent must be an earlier node"),
        (lambda: TreeShape((0, 1, 0)), "depth by depth"),
        (lambda: TreeShape.from_widths((2, 0)), "widths must be integers >= 1"),
        (lambda: TreeShape.parse("wide"), "tuple of widths"),
    ]:
        with pytest.raises(ValueError, match=match):
            bad()


def test_tree_settings_that_cannot_be_exact_are_refused():
    tree = TreeShape.from_widths((2, 1))
    assert decoding.DecodeConfig(8, (1,), tree=tree).gamma == 2
    assert decoding.DecodeConfig(8, (1,), tree=tree).block == 4
    with pytest.raises(ValueError, match="differs from the depth"):
        decoding.DecodeConfig(8, (1,), gamma=3, tree=tree)
    with pytest.raises(ValueError, match=r"acceptance must be one of \('token', 'traversal'\)"):
        decoding.DecodeConfig(8, (1,), tree=tree, acceptance="block")
    with pytest.raises(ValueError, match="lenience must be 1.0"):
        decoding.DecodeConfig(8, (1,), tree=tree, lenience=0.5)
    with pytest.raises(ValueError, match="gamma_policy must be"):
        decoding.DecodeConfig(8, (1,), tree=tree, gamma_policy=decoding.GammaPolicy("confidence"))


def test_the_job_refuses_exactly_the_tree_settings_decode_config_refuses():
    """TREE's job check (job_config.speculation_spec) applies DecodeConfig's one rule, in its words."""
    tree = TreeShape.from_widths((2, 1))
    policies = [decoding.GammaPolicy(), decoding.GammaPolicy("confidence")]
    policies += [decoding.GammaPolicy("schedule", initial=2)]
    for name in acceptance.NAMES:
        for lenience in (1, 1.0, 0.5):
            for policy in policies:
                try:
                    decoding.DecodeConfig(8, (1,), tree=tree, acceptance=name,
                                          lenience=lenience, gamma_policy=policy)  # fmt: skip
                    refused = False
                except ValueError:
                    refused = True
                try:
                    spec = job_config.speculation_spec(None, (2, 1), policy, lenience, name)
                    assert spec.tree == tree
                except JobError as e:
                    assert refused and str(e).startswith("TREE is verified by the exact tree rule")
                else:
                    assert not refused, (name, lenience, policy)


def test_a_draft_refuses_a_tree_it_cannot_grow(target, draft, batch):
    general = TreeShape((0, 0, 1, 2))
    with pytest.raises(ValueError, match="cannot propose a tree parents"):
        decoding.speculative_decode(
            *target, *draft, batch, tree=general, max_decode_len=4, eos_id=1
        )


# ------------------------------------------------------------------------------------------------
# Tree attention and keeping a path.

TREE = TreeShape((0, 0, 1, 1, 2, 3, 3))  # a general tree, depth 3


def _paths(tree: TreeShape) -> list[list[int]]:
    """Each node's path from the root (node ids, root first)."""
    return [list(np.flatnonzero(tree.ancestors[j])) for j in range(tree.size + 1)]


def _check_tree_attention(model, params, state, start, tokens):
    """tokens [B, N+1] scored as TREE from `state` equal each path decoded causally; keeping a
    path then extending equals extending the causal path."""
    # Jitted: one program per block length, where eager calls compiled every op of T5 anew.
    extend = jax.jit(model.extend)
    logits, tree_state = jax.jit(lambda *a: model.extend(*a, TREE.ancestors))(
        params, state.replace(index=start), tokens
    )
    for node, path in enumerate(_paths(TREE)):
        causal, _ = extend(params, state.replace(index=start), tokens[:, path])
        np.testing.assert_allclose(logits[:, node], causal[:, -1], rtol=2e-5, atol=2e-5)
    path = [0, 2, 5]  # a path through a non-first child
    kept = base.keep_path(tree_state, start, jnp.tile(jnp.asarray(path), (tokens.shape[0], 1)))
    follow = jnp.full((tokens.shape[0], 1), 3, jnp.int32)
    after, _ = extend(params, kept.replace(index=start + len(path)), follow)
    whole = jnp.concatenate([tokens[:, path], follow], axis=1)
    causal, _ = extend(params, state.replace(index=start), whole)
    np.testing.assert_allclose(after[:, 0], causal[:, -1], rtol=2e-5, atol=2e-5)


def test_tree_attention_decoder_only(target, batch):
    model, params = target
    # Jitted, as the decode loops run it (the eager prefill compiled every op of it anew).
    state, pos, _, _ = jax.jit(lambda p, b: decoding.prefill(model, p, b, 32))(params, batch)
    tokens = jax.random.randint(jax.random.PRNGKey(3), (pos.shape[0], TREE.size + 1), 2, 20)
    _check_tree_attention(model, params, state, pos, tokens)


@pytest.mark.slow  # ~17 s; T5's tree attention end to end: test_tree_greedy_t5_is_plain_greedy
def test_tree_attention_t5():
    target, params, _, _ = helpers.tiny_t5_pair(40, seed=0)
    enc = helpers.encoder_batch(1, batch=3, width=6, vocab=40)
    state = target.init_state(params, enc, 24)
    prefix = jax.random.randint(jax.random.PRNGKey(4), (3, 4), 2, 40)
    _, state = target.extend(params, state, prefix)
    tokens = jax.random.randint(jax.random.PRNGKey(5), (3, TREE.size + 1), 2, 40)
    _check_tree_attention(target, params, state, state.index, tokens)


# ------------------------------------------------------------------------------------------------
# The tree rule alone, against the exact target distribution.

V, ROWS = 4, 40_000


def _tables(seed: int, depth: int):
    """p and q for every prefix up to depth + 1 tokens: dicts tuple -> [V] (zeros included)."""
    rng = np.random.default_rng(seed)
    p, q = {}, {}
    prefixes = [()]
    for _ in range(depth + 2):
        for prefix in prefixes:
            p[prefix] = rng.dirichlet(np.ones(V) * 0.7)
            q[prefix] = rng.dirichlet(np.ones(V) * 0.7)
            if len(prefix) % 2 == 0:
                q[prefix][rng.integers(V)] = 0.0  # the draft never proposes a token p likes
                q[prefix] /= q[prefix].sum()
            if len(prefix) == 1:
                p[prefix][rng.integers(V)] = 0.0
                p[prefix] /= p[prefix].sum()
        prefixes = [pre + (t,) for pre in prefixes for t in range(V)]
    return p, q


def _log(x):
    with np.errstate(divide="ignore"):
        return np.log(x)


# One compiled program per (width, sampling) instead of the draw's operations one by one.
_siblings = jax.jit(siblings, static_argnums=(2, 3))


def _round_then_complete(tree, p, q, draw, seed, broken_siblings=False, verify=None):
    """One tree round per row (by `verify`, the token rule's `verify_tree` by default), each output
    completed from p to depth + 1 tokens."""
    rng = np.random.default_rng(seed)
    key = jax.random.PRNGKey(seed)
    prefix = [[() for _ in range(ROWS)]] + [None] * tree.size
    tokens = np.zeros((ROWS, tree.size), np.int32)
    log_q = np.zeros((ROWS, tree.size, V), np.float32)
    for parent in range(tree.size + 1):
        kids = [k for k in tree.children[parent] if k > 0]
        if not kids:
            continue
        key, sub = jax.random.split(key)
        dist = np.stack([q[pre] for pre in prefix[parent]])
        if draw == "sampled":
            kid_tokens, kid_log_q = _siblings(sub, jnp.asarray(_log(dist)), len(kids), _T1)
            kid_tokens, kid_log_q = np.asarray(kid_tokens), np.asarray(kid_log_q)
            if broken_siblings:  # every sibling claims the full q: the draws are not from it
                kid_log_q = np.repeat(kid_log_q[:, :1], len(kids), axis=1)
        else:  # fixed proposals, colliding when two draws agree (a lookup draft)
            kid_tokens = np.stack([_choices(rng, dist) for _ in kids], axis=1).astype(np.int32)
            kid_log_q = _log(np.eye(V)[kid_tokens])
        for r, kid in enumerate(kids):
            tokens[:, kid - 1] = kid_tokens[:, r]
            log_q[:, kid - 1] = kid_log_q[:, r]
            prefix[kid] = [pre + (int(t),) for pre, t in zip(prefix[parent], kid_tokens[:, r])]
    target_logits = np.stack(
        [np.stack([_log(p[pre]) for pre in prefix[j]]) for j in range(tree.size + 1)], axis=1
    )
    rule = verify or tree_rule.verify_tree

    # One compiled call, as the decode loop runs the rule (eagerly every op compiled on its own);
    # traced here, so a rule patched by a test is the one compiled. The round's static fields are
    # numpy: it is built inside.
    @jax.jit
    def one_round(key, target_logits, log_q, tokens):
        return rule(key, TreeRound(target_logits, log_q, tokens, tree.children, tree.depth), _T1)

    path, n, nxt, _, _ = one_round(
        jax.random.PRNGKey(seed + 1),
        jnp.asarray(target_logits, jnp.float32),
        jnp.asarray(log_q),
        jnp.asarray(tokens),
    )
    path, n, nxt = np.asarray(path), np.asarray(n), np.asarray(nxt)
    # Completion draws in row order, one uniform each, as rng.choice(V, p=p[seq]) row by row.
    uniforms = iter(rng.random(int(np.sum(tree.depth - n))).tolist())
    cdfs = {}
    samples = []
    for row in range(ROWS):
        seq = tuple(int(tokens[row, j - 1]) for j in path[row, : n[row]]) + (int(nxt[row]),)
        while len(seq) < tree.depth + 1:
            if seq not in cdfs:
                cdfs[seq] = _cdf(p[seq][None])[0]
            seq += (int(np.searchsorted(cdfs[seq], next(uniforms), side="right")),)
        samples.append(seq)
    return samples, float(np.mean(n))


def _cdf(dists):
    """Rows' cumulative sums scaled to end at 1, as numpy's Generator.choice computes them."""
    cdf = np.cumsum(dists, axis=-1)
    return cdf / cdf[:, -1:]


def _choices(rng, dists):
    """`[rng.choice(V, p=d) for d in dists]` at once: the same uniforms from rng, the same tokens."""
    cdf, u = _cdf(dists), rng.random(len(dists))
    return np.sum(cdf <= u[:, None], axis=-1)


def _exact(p, length):
    probs = {(): 1.0}
    for _ in range(length):
        probs = {s + (t,): pr * p[s][t] for s, pr in probs.items() for t in range(V)}
    return {s: pr for s, pr in probs.items() if pr > 0}


_T1 = SamplingConfig(temperature=1.0)
_SHAPES = {"widths": TreeShape.from_widths((3, 2, 1)), "general": TreeShape((0, 0, 1, 1, 2, 3))}


@pytest.mark.parametrize("shape", list(_SHAPES))
@pytest.mark.parametrize("draw", ["sampled", "fixed"])
def test_tree_rule_outputs_the_target_distribution(shape, draw):
    tree = _SHAPES[shape]
    p, q = _tables(7, tree.depth)
    samples, accepted = _round_then_complete(tree, p, q, draw, seed=11)
    assert helpers.chi_square_pvalue(samples, _exact(p, tree.depth + 1)) > 1e-3
    assert accepted > 0.5  # the tree is used, not bypassed


def test_tree_rule_beats_its_own_chain():
    """Siblings add acceptance: the same tables accept more with widths (3, 2, 1) than (1, 1, 1)."""
    p, q = _tables(7, 3)
    _, tree_accepted = _round_then_complete(_SHAPES["widths"], p, q, "sampled", seed=5)
    _, chain_accepted = _round_then_complete(TreeShape.from_widths((1, 1, 1)), p, q, "sampled", 5)
    assert tree_accepted > chain_accepted + 0.1


def test_broken_tree_rules_are_caught(monkeypatch):
    tree = _SHAPES["widths"]
    p, q = _tables(7, tree.depth)
    exact = _exact(p, tree.depth + 1)
    samples, _ = _round_then_complete(tree, p, q, "sampled", seed=11, broken_siblings=True)
    assert helpers.chi_square_pvalue(samples, exact) < 1e-6

    # A residual that is not updated after a rejected sibling (the next sibling tested against p).
    # Patched where the tree rule reads it (decoding/acceptance/residual.py).
    monkeypatch.setattr(acceptance.residual, "residual_after_rejection", lambda p, q: p)
    samples, _ = _round_then_complete(tree, p, q, "sampled", seed=11)
    monkeypatch.undo()
    assert helpers.chi_square_pvalue(samples, exact) < 1e-6


# ------------------------------------------------------------------------------------------------
# Decoding with trees.


@pytest.mark.parametrize(
    "cfg",
    [
        pytest.param(SamplingConfig(temperature=1.0), marks=pytest.mark.slow),  # top-p's path
        # top-k through trees: its filter is the chain's (tests/test_decoding.py); ~17 s
        pytest.param(SamplingConfig(temperature=0.8, top_k=4), marks=pytest.mark.slow),
        SamplingConfig(temperature=1.0, top_p=0.8),
    ],
    ids=["t1", "topk", "topp"],
)
def test_tree_decoding_samples_the_target_distribution(small_pair, small_target_probs, cfg):
    check_sampled_sequences_follow_target(
        small_pair, small_target_probs(cfg), cfg, gamma=None, draft_power=False,
        tree=TreeShape.from_widths((3, 2)),
    )  # fmt: skip


@pytest.mark.slow  # 24k sampled rows (~19 s); the tree rule with deterministic proposals is
# checked exactly in test_tree_rule_outputs_the_target_distribution[fixed-*]
def test_lookup_tree_decoding_samples_the_target_distribution(small_pair, small_target_probs):
    cfg = SamplingConfig(temperature=1.0)
    (target, params), _ = small_pair
    pair = ((target, params), (PromptLookupDrafter(helpers.SV, max_ngram=2), ()))
    samples, _ = helpers.speculative_samples(
        pair, helpers.repeated_prompt(helpers.N, [1, 3, 1, 3, 2, 1]), gamma=None,
        max_decode_len=helpers.SEQ_LEN, eos_id=helpers.EOS, cfg=cfg,
        tree=TreeShape.from_widths((3, 2, 1)),
    )  # fmt: skip
    exact = helpers.exact_sequence_probs(
        target, params, [1, 3, 1, 3, 2, 1], helpers.SEQ_LEN, helpers.SV, helpers.EOS, cfg
    )
    assert helpers.chi_square_pvalue(samples, exact) > 1e-3


@pytest.mark.parametrize("widths", [(1,), (3, 2, 2, 1), (2,) * 9])
def test_tree_greedy_is_plain_greedy_with_eos_inside_trees(
    target, draft, batch, greedy_reference, widths
):
    eos_id, ref, tables = greedy_reference
    drafts = [draft, target, (NgramDrafter(helpers.GREEDY_VOCAB, 2), tables)]
    drafts.append((PromptLookupDrafter(helpers.GREEDY_VOCAB), ()))
    for drf in drafts if len(widths) == 4 else drafts[1:2]:
        out = decoding.speculative_decode(
            *target, *drf, batch, tree=widths, max_decode_len=helpers.GREEDY_MAX_LEN,
            eos_id=eos_id,
        )  # fmt: skip
        np.testing.assert_array_equal(out.tokens, ref.tokens)
        np.testing.assert_array_equal(out.lengths, ref.lengths)
    assert np.all(np.asarray(out.stats.accepted_at).sum(0) > 0)  # self-draft: deep paths kept


def test_tree_greedy_t5_is_plain_greedy():
    target, params, draft, draft_params = helpers.tiny_t5_pair(40, seed=0)
    enc = helpers.encoder_batch(2, batch=5, width=6, vocab=40)
    ref = decoding.autoregressive_decode(target, params, enc, max_decode_len=10, eos_id=1)
    for drf, drf_params in ((draft, draft_params), (target, params)):
        out = decoding.speculative_decode(
            target, params, drf, drf_params, enc, tree=(3, 2, 1), max_decode_len=10, eos_id=1
        )
        np.testing.assert_array_equal(out.tokens, ref.tokens)
    assert np.asarray(out.stats.accepted).sum() > 0


# ------------------------------------------------------------------------------------------------
# The jobs: TREE in the infer job, tree variants in the benchmark.


def test_infer_job_with_a_tree(tmp_path, monkeypatch):
    monkeypatch.chdir(helpers.ROOT)
    _infer = helpers.tiny_infer
    plain, _ = _infer(tmp_path, "plain", "--gin.SPECULATIVE=False")
    rows, summary = _infer(tmp_path, "tree", "--gin.TREE=(3, 2, 1)")
    assert [r["output_ids"] for r in rows] == [r["output_ids"] for r in plain]
    assert summary["tree"] == [0, 0, 0, 1, 1, 4] and summary["gamma"] == 3
    # Another tree in the same OUTPUT_DIR is another job: refused, not resumed.
    with pytest.raises(JobError, match="tree"):
        _infer(tmp_path, "tree", "--gin.TREE=(2, 1)")
    for flags, match in [
        (["--gin.TREE=(3, 0)"], "TREE: tree widths must be integers >= 1"),
        (["--gin.TREE=(2, 1)", "--gin.ACCEPTANCE='block'"], "TREE is verified by the exact"),
        (["--gin.TREE=(2, 1)", "--gin.GAMMA='auto'"], "GAMMA = 'auto' plans chains"),
        (["--gin.TREE={'parents': (0, 0, 2)}"], "cannot propose a tree parents"),
    ]:
        with pytest.raises(JobError, match=match) as e:
            _infer(tmp_path, "bad", *flags)
        assert "\n" not in str(e.value)


# The benchmark's block and tree variants run in the one variant sweep of
# tests/test_benchmark_variants.py (a sweep costs ~20 s of compiles).
