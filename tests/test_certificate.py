"""Exactness certificates (measure/certificate.py; the certify job and `Pair.certify` run it):
the statistics on draws whose law is known, the whole certificate on the small sampled-check pair
(an exact rule passes, its control too, and the mutation harness's broken rules and a draft that
misreports its q fail), the refusals, and the command's exit statuses on tiny random models.

The small pair (tests/helpers.py: 6 ids, the draft accepted ~60% of the time) decodes 128 rows of
up to 24 tokens a seed; two seeds give ~3,000 scored tokens, enough for MAX_DEVIATION 0.1 (671).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json

import jax
import numpy as np
import pytest

from speculative.decoding import model_drafter, sampling
from speculative.errors import JobError
from speculative.jobs import pairs
from speculative.jobs.certify.config import SamplePlan
from speculative.jobs.certify.run import certify_pair
from speculative.loading import specs as ml
from speculative.measure import certificate
from tests import helpers
from tests.test_mutations import mutated_verify_detailed, replaced_everywhere

ROWS, LENGTH, SEEDS, MAX_DEVIATION = 128, 24, 2, 0.1
T1 = dict(temperature=1.0, top_k=0, top_p=1.0)
NUCLEUS = dict(temperature=0.7, top_k=4, top_p=0.9)


def small_loaded(small_pair) -> pairs.LoadedPair:
    (target, target_params), (draft, draft_params) = small_pair
    return pairs.LoadedPair(
        ml.Loaded(target, target_params, "small target"),
        ml.Loaded(draft, draft_params, "small draft"),
        vocabulary=None,
    )


def small_certificate(small_pair, sampled=T1, gamma=2, tree=None, acceptance="token", **plan):
    """The certificate of the small pair's decode: ROWS rows of helpers.PROMPT, SEEDS seeds."""
    plain, drafting, _ = pairs.decode_arguments(
        (helpers.EOS,), LENGTH, gamma, tree, acceptance, sampled["temperature"],
        sampled["top_k"], sampled["top_p"], 0,
    )  # fmt: skip
    options = {"rows_per_prompt": ROWS, "seeds": SEEDS, "max_deviation": MAX_DEVIATION, **plan}
    return certify_pair(
        small_loaded(small_pair), [helpers.PROMPT], None, plain, drafting, SamplePlan(**options)
    )


# ------------------------------------------------------------------------------------------------
# The statistics, on draws whose law is known.


def _draws(probs: np.ndarray, sampled_from: np.ndarray, seed: int) -> certificate.Scores:
    """Scores of one token per row drawn from `sampled_from` [N, V], scored under `probs` [N, V]."""
    rng = np.random.default_rng(seed)
    cum = np.cumsum(sampled_from, axis=1)
    tokens = (rng.uniform(size=(len(probs), 1)) > cum).sum(axis=1)
    p_x = probs[np.arange(len(probs)), tokens]
    ids = np.arange(probs.shape[1])[None, :]
    ahead = (probs > p_x[:, None]) | ((probs == p_x[:, None]) & (ids < tokens[:, None]))
    return certificate.Scores(
        below=np.sum(np.where(ahead, probs, 0.0), axis=1),
        p=p_x,
        top=probs.max(axis=1),
        sum_p3=np.sum(probs**3, axis=1),
        stop_mass=probs[:, -1],
        is_stop=tokens == probs.shape[1] - 1,
        index=np.zeros(len(probs), np.int64),
        offset=np.arange(len(probs)) % 5,  # five places in a round, in turn
    )


def _random_distributions(n: int, vocab: int, seed: int, sharpness: float = 2.0) -> np.ndarray:
    logits = sharpness * np.random.default_rng(seed).standard_normal((n, vocab))
    return np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)


def test_exact_draws_pass_and_a_sharper_sampler_fails():
    """Draws from p itself pass every test; draws from p sharpened (T = 0.8, the bias a wrong
    rule that over-accepts a confident draft leaves) fail uniformity, and u moves towards 0."""
    p = _random_distributions(4000, 12, seed=0)
    exact = certificate.tests(_draws(p, p, seed=1))
    assert exact["passed"], exact
    sharp = p**1.25 / np.sum(p**1.25, axis=1, keepdims=True)
    biased = certificate.tests(_draws(p, sharp, seed=1))
    assert not biased["uniformity"]["passed"]
    assert sum(biased["uniformity"]["histogram"][:5]) > sum(biased["uniformity"]["histogram"][5:])


def test_the_mid_pit_balance_is_noise_free_and_signed():
    """The mid-PIT's z: about standard normal over exact draws (40 batches: mean near 0, spread
    near 1, so the variance (1 - sum p^3) / 12 is right), negative for a sharper sampler and
    positive for a flatter one, each failing at 1,500 tokens; no noise seed enters it."""
    p = _random_distributions(600, 12, seed=12)
    zs = [certificate.mid_balance(_draws(p, p, seed=s))["z"] for s in range(40)]
    assert abs(np.mean(zs)) < 0.5 and 0.75 < np.std(zs) < 1.3
    p = _random_distributions(1500, 12, seed=12)  # z about -7 and +7 (-3 to -6 at 600)
    sharp = p**1.25 / np.sum(p**1.25, axis=1, keepdims=True)
    flat = p**0.8 / np.sum(p**0.8, axis=1, keepdims=True)
    low, high = (certificate.mid_balance(_draws(p, q, seed=13)) for q in (sharp, flat))
    assert low["z"] < 0 and not low["passed"]
    assert high["z"] > 0 and not high["passed"]
    assert 0 < low["detectable_shift"] < 0.1


def test_a_bias_at_one_place_in_a_round_is_found_there():
    """Draws exact at four of five places in a round and flatter at place 3 (a wrong bonus token,
    say): the overall KS is diluted, the test by place names place 3."""
    p = _random_distributions(3000, 12, seed=14)
    flat = p**0.6 / np.sum(p**0.6, axis=1, keepdims=True)
    mixed = np.where((np.arange(3000) % 5 == 3)[:, None], flat, p)
    found = certificate.tests(_draws(p, mixed, seed=15), seed=(0, 0))
    places = found["by_offset"]["places"]
    assert set(places) == {"0", "1", "2", "3", "4"} and places["3"]["n"] == 600
    assert not found["by_offset"]["passed"]
    assert places["3"]["pvalue"] < found["by_offset"]["level_each"]
    assert min(places[k]["pvalue"] for k in "0124") > 1e-3
    exact = certificate.tests(_draws(p, p, seed=15), seed=(0, 0))
    assert exact["by_offset"]["passed"] and exact["by_offset"]["level_each"] == 1e-3 / 5


def test_the_stop_balance_finds_too_many_stops():
    """Stop token (the last id) drawn 30% more often than p gives it: z > 0 and the test fails;
    from p itself, |z| small."""
    p = _random_distributions(6000, 8, seed=2, sharpness=1.0)
    more = p.copy()
    more[:, -1] *= 1.3
    more /= more.sum(axis=1, keepdims=True)
    assert certificate.stop_balance(_draws(p, p, seed=3))["passed"]
    found = certificate.stop_balance(_draws(p, more, seed=3))
    assert found["z"] > 3.3 and not found["passed"]


def test_the_stop_count_p_value_follows_the_counts_own_law():
    """Stops that come mostly where the target is sure: the normal z of one stop at a 7% position
    is +2.3 (p 0.02), its count's own law says p 0.15; a real excess still fails."""
    chances = np.concatenate([np.ones(8), [0.85, 0.07], np.full(200, 1e-4)])
    scores = certificate.Scores(
        below=np.zeros(210), p=np.ones(210), top=np.ones(210), sum_p3=np.ones(210),
        stop_mass=chances, is_stop=np.arange(210) < 10, index=np.zeros(210, np.int64),
        offset=np.zeros(210, np.int64),
    )  # fmt: skip
    found = certificate.stop_balance(scores)
    assert found["z"] > 2.2 and found["passed"]
    # 2 P(X >= 10) = 2 * 0.85 * (1 - 0.93 * (1 - 1e-4) ** 200) = 0.151
    assert found["pvalue"] == pytest.approx(0.151, abs=0.001)
    more = certificate.stop_balance(dataclasses.replace(scores, is_stop=np.arange(210) < 16))
    assert not more["passed"] and more["pvalue"] < 1e-3


def test_power_statements():
    """Delta_90 (K_0.001 = 1.9495, plus 1.2816 * 0.5) and the sample size it needs: 2,684 tokens
    see a deviation of 0.05; a plan short of them is refused, naming both counts."""
    assert certificate.required_tokens(1e-3, 0.05) == 2684
    assert certificate.detectable_deviation(2684) <= 0.05 < certificate.detectable_deviation(2683)
    with pytest.raises(
        ValueError, match="needs 2684 scored tokens, and this run emits at most 2000"
    ):
        certificate.check_power(2000)
    certificate.check_power(2684)
    with pytest.raises(ValueError, match="level must be in"):
        certificate.check_power(10_000, level=0.0)


def test_caught_at_reports_the_first_failing_prefix():
    p = _random_distributions(8000, 12, seed=4)
    flat = np.full_like(p, 1.0 / p.shape[1])
    assert certificate.caught_at(_draws(p, p, seed=5)) is None
    n = certificate.caught_at(_draws(p, flat, seed=5))
    assert n is not None and n <= 1024


def _with_point_masses(scores: certificate.Scores, every: int) -> certificate.Scores:
    """`scores` with a point-mass position (one token of probability 1, emitted) inserted before
    every `every`-th: the positions top-p leaves a single token at low temperature."""
    n = scores.size
    at = np.arange(0, n, every)
    fill = {"below": 0.0, "p": 1.0, "top": 1.0, "sum_p3": 1.0, "stop_mass": 0.0}
    fill.update(is_stop=False, index=0, offset=0)
    return certificate.Scores(**{
        name: np.insert(getattr(scores, name), at, value) for name, value in fill.items()
    })  # fmt: skip


def test_point_masses_are_left_out_of_uniformity_and_of_the_power():
    """Positions whose distribution is one token carry only the PIT noise: they are not tested
    and not counted towards the power, and a bias among the others is found as well as without
    them (the same u; mixing in noise would have diluted it)."""
    p = _random_distributions(1500, 12, seed=6)
    flat = p**0.8 / np.sum(p**0.8, axis=1, keepdims=True)
    biased = _draws(p, flat, seed=7)
    padded = _with_point_masses(biased, every=1)  # half the positions point masses
    assert padded.size == 3000 and int(padded.informative.sum()) == 1500
    alone, mixed = certificate.tests(biased, seed=3), certificate.tests(padded, seed=3)
    assert mixed["informative"] == alone["informative"] == mixed["uniformity"]["n"] == 1500
    assert mixed["tokens"] == 3000
    assert mixed["uniformity"]["detectable_deviation"] == certificate.detectable_deviation(1500)
    assert not alone["uniformity"]["passed"] and not mixed["uniformity"]["passed"]
    # Tested over every position (the old rule), the same biased draws pass: the noise hides them.
    noise = np.random.default_rng(3).uniform(size=padded.size)
    every_u = np.clip(padded.below + noise * padded.p, 0.0, 1.0)
    assert certificate.uniformity(every_u)["pvalue"] > 100 * mixed["uniformity"]["pvalue"]


def test_the_pit_noise_is_seeded_per_run_and_per_program():
    """`certify` draws each program's noise from (noise_seed, its index): the control's u are not
    the speculative program's on the same tokens, and another seed draws other noise. Scored
    here on point-mass-free draws so the u differ only by their noise."""
    p = _random_distributions(500, 12, seed=8)
    scores = _draws(p, p, seed=9)
    kept: dict[str, certificate.Scores] = {}
    found = {}
    for seed in (0, 1):
        found[seed] = certificate.certify(
            lambda speculative, s: (np.zeros((1, 1)), np.ones(1), np.zeros((1, 1))),
            lambda t, n, o: scores,
            sampling.SamplingConfig(temperature=1.0), [0], max_deviation=0.2, noise_seed=seed,
            keep=kept.__setitem__,
        )  # fmt: skip
    assert set(kept) == {"speculative", "plain"}
    np.testing.assert_array_equal(kept["plain"].below, scores.below)
    hist = {
        (seed, name): found[seed][name]["uniformity"]["histogram"]
        for seed in (0, 1)
        for name in ("speculative", "plain")
    }
    assert len({tuple(h) for h in hist.values()}) == 4
    np.testing.assert_array_equal(
        certificate.pit(scores, (0, 1)), certificate.pit(scores, (0, 1))
    )  # and the same seed, the same u


def test_scores_round_trip_through_json():
    p = _random_distributions(50, 6, seed=10)
    scores = _with_point_masses(_draws(p, p, seed=11), every=5)
    back = certificate.Scores.from_json(json.loads(json.dumps(scores.to_json())))
    for name in ("below", "p", "top", "stop_mass"):
        np.testing.assert_allclose(getattr(back, name), getattr(scores, name), rtol=1e-6)
    np.testing.assert_array_equal(back.is_stop, scores.is_stop)
    np.testing.assert_array_equal(back.index, scores.index)
    again, first = certificate.tests(back, seed=(0, 0)), certificate.tests(scores, seed=(0, 0))
    assert again["uniformity"]["pvalue"] == pytest.approx(first["uniformity"]["pvalue"], rel=1e-6)
    assert again["stops"]["z"] == pytest.approx(first["stops"]["z"], rel=1e-6)


# ------------------------------------------------------------------------------------------------
# The whole certificate on the small pair.


@pytest.mark.parametrize(
    "sampled, gamma, tree, acceptance",
    [(T1, 2, None, "token"), (NUCLEUS, 3, None, "block"), (T1, None, (2, 1), "traversal")],
    ids=["t1-chain", "nucleus-block", "t1-tree-traversal"],
)
def test_an_exact_decode_is_certified(small_pair, sampled, gamma, tree, acceptance):
    found = small_certificate(small_pair, sampled, gamma, tree, acceptance)
    assert found["status"] == "pass", found["reasons"]
    for name in ("speculative", "plain"):
        assert found[name]["tokens"] >= certificate.required_tokens(max_deviation=MAX_DEVIATION)
        assert found[name]["uniformity"]["detectable_deviation"] <= MAX_DEVIATION
        assert found[name]["stops"]["emitted"] > 100  # rows end inside the 24 tokens: stops seen


@contextlib.contextmanager
def misreporting_draft():
    """A draft that samples from q at 1.6 times the temperature and reports q as it should be."""

    def hot_sample(rng, logits, cfg):
        tokens, _ = sampling.sample(rng, logits / 1.6, cfg)
        return tokens, sampling.process_logits(logits, cfg)

    original = model_drafter.sample
    jax.clear_caches()
    model_drafter.sample = hot_sample
    try:
        yield
    finally:
        model_drafter.sample = original
        jax.clear_caches()


# Broken rules, each caught (at this size) by the named test of the speculative program.
BROKEN = {
    "accept_all": "uniformity",
    "residual_abs": "uniformity",
    "residual_unclamped": "uniformity",
    "misreported_q": "uniformity",
}


@pytest.mark.parametrize("broken", sorted(BROKEN))
def test_a_broken_rule_fails_the_certificate(small_pair, broken):
    """The mutation harness's broken rules and a draft whose reported q is not the q it sampled
    from: the certificate fails on the speculative program (not the control), by uniformity."""
    if broken == "misreported_q":
        context = misreporting_draft()
    else:
        context = replaced_everywhere(sampling, "verify_detailed", mutated_verify_detailed(broken))
    with context:
        found = small_certificate(small_pair, control=False)
    assert found["status"] == "fail"
    assert f"speculative: {BROKEN[broken]} failed" in found["reasons"]


def test_greedy_is_certified_by_identity(small_pair):
    found = small_certificate(small_pair, dict(temperature=0.0, top_k=0, top_p=1.0))
    assert found["status"] == "pass"
    assert found["identity"] == {"rows": ROWS, "identical": ROWS, "passed": True}


def test_too_few_samples_are_refused_before_decoding(small_pair):
    # 128 rows x 24 tokens x 1 seed = 3,072 at most; a deviation of 0.02 needs 16,774
    with pytest.raises(JobError, match="too few samples to have power: .* needs 16774 scored"):
        small_certificate(small_pair, seeds=1, max_deviation=0.02)
    with pytest.raises(JobError, match="seeds must be a positive integer, got 0"):
        small_certificate(small_pair, seeds=0)


# ------------------------------------------------------------------------------------------------
# The command and the notebook, on tiny random models with the byte vocabulary.

TINY = ["--gin_file=configs/certify/tiny_random.gin"]


def test_the_command_writes_a_certificate_and_exits_by_its_status(tmp_path, capsys):
    from speculative import certify

    out = tmp_path / "cert"
    argv = [*TINY, f"--gin.OUTPUT_DIR='{out}'"]
    assert certify.cli(argv) == 0
    found = json.loads((out / "certificate.json").read_text())
    assert found["status"] == "pass" and found["plan"]["rows"] == 8
    assert found["speculative"]["tokens"] > 0 and found["plain"]["tokens"] > 0
    assert {"git_commit", "git_dirty", "gin_config"} <= set(found["provenance"])
    assert {"jax", "cpu", "argv"} <= set(found["environment"])
    assert "certificate pass" in capsys.readouterr().out
    # Every scored token is kept: the tests re-run on them give the certificate's numbers.
    kept = json.loads((out / "scores.json").read_text())
    for index, name in enumerate(("speculative", "plain")):
        retested = certificate.tests(certificate.Scores.from_json(kept[name]), seed=(0, index))
        assert retested["uniformity"] == found[name]["uniformity"]
    # A plan without power: exit 2 and one line, before any model is built.
    assert certify.cli([*argv, "--gin.MAX_DEVIATION=0.01"]) == 2
    assert capsys.readouterr().err == (
        "error: too few samples to have power: a certificate at level 0.001 that sees a deviation"
        " of 0.01 needs 67094 scored tokens, and this run emits at most 512 (rows x seeds x "
        "max_new_tokens); add rows or seeds, or allow a larger max_deviation\n"
    )
    assert certify.cli([*argv, "--gin.DRAFT=None"]) == 2
    assert "DRAFT is None: a certificate needs a draft" in capsys.readouterr().err
    with replaced_everywhere(sampling, "verify_detailed", mutated_verify_detailed("accept_all")):
        assert certify.cli([*argv, "--gin.CONTROL=False", "--gin.SEEDS=8"]) == 1
    assert json.loads((out / "certificate.json").read_text())["status"] == "fail"


def test_prompts_come_from_texts_a_file_and_spec_bench_questions(tmp_path):
    """PROMPTS, then INPUT_FILE's first INPUT_LIMIT inputs, then the questions' first turns."""
    from speculative import vocab
    from speculative.jobs.certify.config import CertifyConfig
    from speculative.jobs.certify.run import prompts_of

    inputs_file = tmp_path / "inputs.jsonl"
    inputs_file.write_text("".join(json.dumps({"inputs": f"line {i}"}) + "\n" for i in range(5)))
    questions = tmp_path / "question.jsonl"
    row = {"question_id": 81, "category": "translation", "turns": ["Bonjour ?", "Et puis ?"]}
    questions.write_text(json.dumps(row) + "\n")
    cfg = CertifyConfig(
        output_dir="unused", target=None, prompts=["a prompt"], chat=False,
        input_file=str(inputs_file), input_limit=2, questions=str(questions),
        tasks=["translation"],
    )  # fmt: skip
    byte = vocab.ByteVocabulary()
    ids, texts = prompts_of(cfg, byte)
    assert texts == ["a prompt", "line 0", "line 1", "Bonjour ?"]
    assert ids == [byte.encode(t) for t in texts]
    with pytest.raises(JobError, match="no prompts: set PROMPTS, INPUT_FILE"):
        prompts_of(CertifyConfig(output_dir="unused", target=None, chat=False), byte)
    # CHAT: each text a user turn through the template, as the other jobs render it
    from tests.test_cross_vocab import TARGET_TEXT, _trained

    bpe = _trained(TARGET_TEXT, 300, "<|endoftext|>")
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"
    ids, texts = prompts_of(dataclasses.replace(cfg, chat=True, chat_template=template), bpe)
    assert texts[0] == "<user>a prompt<assistant>" and texts[-1] == "<user>Bonjour ?<assistant>"
    assert ids == [bpe.encode_rendered(t) for t in texts]
    with pytest.raises(JobError, match="chat template"):
        prompts_of(dataclasses.replace(cfg, chat=True), bpe)  # it has no template of its own


def test_the_notebook_certifies_with_the_jobs_code():
    """`Pair.certify` on the tiny random pair: the plan and decode options as keywords, a pass at
    T = 1, identity at T = 0, and an option neither takes refused in one line."""
    import speculative
    from speculative.models import decoder

    def tiny(layers: int) -> ml.ModelSpec:
        config = decoder.DecoderConfig(
            vocab_size=264, emb_dim=32, num_layers=layers, num_heads=4, num_kv_heads=2,
            head_dim=8, mlp_dim=64, max_seq_len=256,
        )  # fmt: skip
        return ml.ModelSpec("random", model=decoder.DecoderLM(config), seed=layers)

    pair = speculative.load_pair(
        tiny(2), tiny(1), vocabulary=speculative.VocabSpec("byte", extra_ids=0)
    )
    prompts = ["def add(a, b):", "x = 1; y"]
    found = pair.certify(prompts, rows_per_prompt=4, seeds=2, max_new_tokens=32, max_deviation=0.2)
    assert found["status"] == "pass" and found["plan"]["rows"] == 8
    assert found["sampling"]["temperature"] == 1.0 and found["decode"]["gamma"] == 4
    greedy = pair.certify(prompts, temperature=0.0, max_new_tokens=16, max_deviation=0.2)
    assert greedy["identity"] == {"rows": 8, "identical": 8, "passed": True}
    with pytest.raises(JobError, match="certify: .*unexpected keyword argument 'rows'"):
        pair.certify(prompts, rows=4)
