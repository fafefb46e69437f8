"""Exactness certificates: does a decode's output follow the target's own distribution, on this
model, with these settings? (docs/design.md §8, "Exactness certificates")

A sampled decode (T > 0) emits tokens x_1, x_2, ... in each row. Each is scored by the target,
teacher-forced over the row's prompt and the tokens before it, processed as the decoder processes
it (temperature, top-k, top-p: `sampling.process_logits`): p_t. If the decode is exact, x_t is a
draw from p_t given everything before it, so the randomized probability integral transform

    u_t = P_t(y ranks before x_t) + U_t * p_t(x_t),   U_t ~ Uniform(0, 1), independent,

is Uniform(0, 1) and independent across tokens, whatever the model. Tokens rank by p_t descending
(ties by id): any order fixed by the prefix would do, this one moves u towards 0 for a sampler
sharper than p_t and towards 1 for a flatter one. Tested by Kolmogorov-Smirnov, over the
informative positions only: where p_t is a point mass (its top token holds at least POINT_MASS,
common under top-k / top-p at low temperature) u_t is U_t alone, noise that says nothing about the
decoder and dilutes the test. Whether a position is a point mass depends on p_t, fixed before x_t
is drawn, so the informative u_t stay independent uniforms. The noise U comes from a seed per run
and per program (`certify`'s noise_seed): a fixed stream shared by every certificate made their
verdicts move together (docs/exactness.md, "A false alarm, explained").

The randomization costs power where p_t(x_t) is large: u_t is then mostly U_t. Its noise-free
part, the mid-PIT m_t = P_t(ranked before x_t) + p_t(x_t) / 2, has mean 1/2 and variance
(1 - sum_y p_t(y)^3) / 12 given the past whatever p_t is, so sum_t (m_t - 1/2) is a martingale
and its z-score a second, noise-free test ("balance"): negative for a sampler sharper than p_t,
positive for a flatter one (a point mass adds 0 to both sums).

Stop tokens get a test of their own, since where rows end is what a length bias shows:
sum_t (1[x_t is a stop] - p_t(stops)) is a martingale of mean 0 and variance
sum_t p_t(stops) (1 - p_t(stops)); its z-score, with the p-value from the count's law given the
visited positions' stop chances (Poisson-binomial: the normal is far off with few stops). A
token the scorer gives probability 0 (outside the top-k / top-p support) is counted; beyond a
share of OUTSIDE_SHARE it fails (numerics at a support boundary may flip a rare one).

Power, stated with every test: KS at level `level` over n values rejects, with probability at least
0.9, any distribution of u whose CDF is Delta_90 = (K_level + 1.2816 * 0.5) / sqrt(n) from the
uniform's somewhere (K_level: the Kolmogorov distribution's upper quantile; the empirical CDF at
the farthest point has a standard deviation of at most 0.5 / sqrt(n)). The balance test finds a
mean shift of the mid-PIT of (z_{level/2} + 1.2816) * sigma / n per informative token, and the stop
test an excess or deficit of (z_{level/2} + 1.2816) * sigma stop tokens, with probability 0.9.
Uniformity is also tested at each place in a round apart (`by_offset`, Bonferroni over the places).
Each test is at `level`; a certificate's five together false-alarm at most 5 * level.

Greedy (T = 0): every row of the speculative decode must equal plain decoding's. Plain decoding
goes through the same tests as the control: a failing control says the scoring is off, not the draft.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from speculative.decoding import sampling as sampling_lib
from speculative.decoding.sampling import SamplingConfig
from speculative.decoding.state import teacher_forced_logits

LEVEL = 1e-3  # each test's false-alarm rate
TESTS = ("uniformity", "by_offset", "balance", "stops", "outside_support")  # a program's
MAX_DEVIATION = 0.05  # the KS deviation a certificate must see with probability 0.9
OUTSIDE_SHARE = 1e-3  # tokens outside the scorer's support allowed, as a share
POINT_MASS = 1.0 - 1e-6  # a position whose top token holds this much carries no information
_Z_POWER = float(stats.norm.ppf(0.9))  # 1.2816
_SD_BOUND = 0.5  # largest standard deviation of an empirical CDF value, per sqrt(n)


@dataclasses.dataclass(frozen=True)
class Scores:
    """The target's teacher-forced view of emitted tokens, N of them (rows concatenated, in order).

    below: [N] mass of the tokens ranked before each (by probability descending, ties by id);
    p: [N] its probability; top: [N] the largest probability there; sum_p3: [N] the sum of the
    cubed probabilities there (the mid-PIT's variance); stop_mass: [N] the stop tokens'
    probability there; is_stop: [N] bool; index: [N] its position in its row (0 = the first
    generated token); offset: [N] its place in the round that emitted it (0 = the round's first;
    `DecodeOutput.round_offsets`).
    """

    below: np.ndarray
    p: np.ndarray
    top: np.ndarray
    sum_p3: np.ndarray
    stop_mass: np.ndarray
    is_stop: np.ndarray
    index: np.ndarray
    offset: np.ndarray

    @property
    def size(self) -> int:
        return len(self.p)

    @property
    def informative(self) -> np.ndarray:
        """[N] bool: positions whose distribution is not a point mass (module docstring)."""
        return self.top < POINT_MASS

    def to_json(self) -> dict[str, list]:
        """Plain lists (floats to float32's precision), to keep beside a certificate."""
        out: dict[str, list] = {}
        for f in dataclasses.fields(self):
            values = getattr(self, f.name)
            if values.dtype.kind == "f":
                out[f.name] = [float(f"{v:.9g}") for v in values.tolist()]
            else:
                out[f.name] = values.tolist()
        return out

    @classmethod
    def from_json(cls, data: dict[str, list]) -> Scores:
        """`to_json`'s lists back; the floats through float32, as `score` computed them (so a
        re-test gives the certificate's numbers bit for bit)."""
        kinds = {"is_stop": bool, "index": np.int64, "offset": np.int64}
        if "offset" not in data:  # kept before round offsets were recorded: unknown, all 0
            data = {**data, "offset": [0] * len(data["p"])}
        return cls(**{
            f.name: np.asarray(data[f.name], kinds.get(f.name, np.float32)).astype(
                kinds.get(f.name, np.float64)
            )
            for f in dataclasses.fields(cls)
        })  # fmt: skip

    @classmethod
    def concat(cls, parts: Sequence[Scores]) -> Scores:
        fields = [f.name for f in dataclasses.fields(cls)]
        return cls(**{f: np.concatenate([getattr(s, f) for s in parts]) for f in fields})

    def head(self, n: int) -> Scores:
        """The first n tokens."""
        return Scores(**{f.name: getattr(self, f.name)[:n] for f in dataclasses.fields(self)})


@functools.partial(jax.jit, static_argnums=(0, 4, 5))
def _score_rows(model, params, batch, tokens, sampling: SamplingConfig, stops: tuple[int, ...]):
    """[b, T] tokens -> (below, p, top, sum_p3, stop_mass), each [b, T] float32 (`Scores`)."""
    logits = teacher_forced_logits(model, params, batch, tokens)  # [b, T, V]
    probs = jnp.exp(sampling_lib.process_logits(logits, sampling))
    tokens = tokens.astype(jnp.int32)[..., None]
    p_x = jnp.take_along_axis(probs, tokens, axis=-1)
    ids = jax.lax.broadcasted_iota(jnp.int32, probs.shape, probs.ndim - 1)
    ahead = (probs > p_x) | ((probs == p_x) & (ids < tokens))
    below = jnp.sum(jnp.where(ahead, probs, 0.0), axis=-1)
    stop_mass = jnp.sum(probs[..., jnp.asarray(stops, jnp.int32)], axis=-1)
    return below, p_x[..., 0], jnp.max(probs, axis=-1), jnp.sum(probs**3, axis=-1), stop_mass


def score(
    model: Any,
    params: Any,
    batch: dict[str, jax.Array],
    tokens: np.ndarray,
    lengths: np.ndarray,
    sampling: SamplingConfig,
    stops: Sequence[int],
    offsets: np.ndarray | None = None,
    rows_per_call: int = 4,
) -> Scores:
    """Scores a decode's outputs (tokens [B, T], lengths [B]: a row's tokens past its length are
    padding; offsets [B, T] their places in their rounds, None: all 0) under the target's
    processed distribution, a few rows a compiled call (the [b, T, V] probabilities are the
    memory), no Python loop over positions or the vocabulary."""
    size = int(np.asarray(lengths).shape[0])
    chunk = max(d for d in range(1, min(rows_per_call, size) + 1) if size % d == 0)
    parts = []
    for start in range(0, size, chunk):
        rows = jax.tree.map(lambda a, s=start: a[s : s + chunk], batch)
        part = _score_rows(model, params, rows, jnp.asarray(tokens[start : start + chunk]),
                           sampling, tuple(int(s) for s in stops))  # fmt: skip
        parts.append([np.asarray(a) for a in part])
    below, p, top, sum_p3, stop_mass = (np.concatenate(a) for a in zip(*parts, strict=True))
    counted = np.arange(tokens.shape[1])[None, :] < np.asarray(lengths)[:, None]
    return Scores(
        below=below[counted].astype(np.float64),
        p=p[counted].astype(np.float64),
        top=top[counted].astype(np.float64),
        sum_p3=sum_p3[counted].astype(np.float64),
        stop_mass=stop_mass[counted].astype(np.float64),
        is_stop=np.isin(np.asarray(tokens)[counted], np.asarray(stops)),
        index=np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape)[counted],
        offset=(np.zeros(tokens.shape, np.int64) if offsets is None else np.asarray(offsets))[
            counted
        ].astype(np.int64),
    )


def required_tokens(level: float = LEVEL, max_deviation: float = MAX_DEVIATION) -> int:
    """Scored tokens a certificate needs for Delta_90 <= max_deviation at this level."""
    k = float(stats.kstwobign.isf(level))
    return math.ceil(((k + _Z_POWER * _SD_BOUND) / max_deviation) ** 2)


def detectable_deviation(n: int, level: float = LEVEL) -> float:
    """Delta_90: the KS deviation found with probability 0.9 among n values (module docstring)."""
    return (float(stats.kstwobign.isf(level)) + _Z_POWER * _SD_BOUND) / math.sqrt(max(n, 1))


def check_power(planned: int, level: float = LEVEL, max_deviation: float = MAX_DEVIATION) -> None:
    """Refuses a plan whose most tokens (rows x seeds x max_new_tokens) cannot reach the power."""
    if not 0.0 < level < 0.5:
        raise ValueError(f"level must be in (0, 0.5), got {level!r}")
    if not 0.0 < max_deviation < 1.0:
        raise ValueError(f"max_deviation must be in (0, 1), got {max_deviation!r}")
    need = required_tokens(level, max_deviation)
    if planned < need:
        raise ValueError(
            f"too few samples to have power: a certificate at level {level:g} that sees a "
            f"deviation of {max_deviation:g} needs {need} scored tokens, and this run emits at "
            f"most {planned} (rows x seeds x max_new_tokens); add rows or seeds, or allow a "
            f"larger max_deviation"
        )


Seed = int | Sequence[int]  # numpy's default_rng seed: an int or a sequence of ints


def pit(scores: Scores, seed: Seed = 0) -> np.ndarray:
    """[n] the randomized probability integral transform u (module docstring) at the informative
    positions, in order."""
    noise = np.random.default_rng(seed).uniform(size=scores.size)
    u = np.clip(scores.below + noise * scores.p, 0.0, 1.0)
    return u[scores.informative]


def uniformity(u: np.ndarray, level: float = LEVEL) -> dict[str, Any]:
    """Kolmogorov-Smirnov of u against Uniform(0, 1), with its power and a 10-bin histogram."""
    test = stats.kstest(u, "uniform")
    return {
        "n": len(u),
        "statistic": float(test.statistic),
        "pvalue": float(test.pvalue),
        "detectable_deviation": detectable_deviation(len(u), level),
        "histogram": np.histogram(u, bins=10, range=(0.0, 1.0))[0].tolist(),
        "passed": bool(test.pvalue >= level),
    }


MIN_PER_OFFSET = 50  # informative tokens a round place needs to be tested on its own


def by_offset(u: np.ndarray, offsets: np.ndarray, level: float = LEVEL) -> dict[str, Any]:
    """KS of the informative u at each place in a round (`Scores.offset`) with at least
    MIN_PER_OFFSET of them, each at level / (places tested) (Bonferroni): a rule wrong only at
    one place (the bonus token, say) shows there first."""
    places = [int(k) for k in np.unique(offsets) if np.sum(offsets == k) >= MIN_PER_OFFSET]
    each = level / max(len(places), 1)
    found = {}
    for k in places:
        test = stats.kstest(u[offsets == k], "uniform")
        found[str(k)] = {"n": int(np.sum(offsets == k)), "pvalue": float(test.pvalue)}
    passed = all(f["pvalue"] >= each for f in found.values())
    return {"places": found, "level_each": each, "passed": passed}


def mid_balance(scores: Scores, level: float = LEVEL) -> dict[str, Any]:
    """The mid-PIT's sum against its mean (module docstring): z, and the mean shift per
    informative token it finds with probability 0.9 (negative z: sharper than the target)."""
    mid = scores.below + 0.5 * scores.p - 0.5
    sigma = math.sqrt(float(np.sum(np.clip(1.0 - scores.sum_p3, 0.0, 1.0))) / 12.0)
    z = float(np.sum(mid)) / sigma if sigma > 0 else 0.0
    n = max(int(np.sum(scores.informative)), 1)
    return {
        "z": z,
        "pvalue": float(2 * stats.norm.sf(abs(z))),
        "detectable_shift": (float(stats.norm.isf(level / 2)) + _Z_POWER) * sigma / n,
        "passed": bool(2 * stats.norm.sf(abs(z)) >= level),
    }


def stop_balance(scores: Scores, level: float = LEVEL) -> dict[str, Any]:
    """Stop tokens emitted against their expected count along the sampled paths: z, power, and a
    p-value from the count's own law (`_count_pvalue`), not the normal's: a chat answer's stops
    mostly come where the target is sure (p = 1), so a few uncertain positions carry the whole
    variance, and one stop where the target gave 7% would read as z = +2.4."""
    emitted, expected = int(scores.is_stop.sum()), float(scores.stop_mass.sum())
    sigma = math.sqrt(float(np.sum(scores.stop_mass * (1.0 - scores.stop_mass))))
    z = (emitted - expected) / sigma if sigma > 0 else 0.0
    detectable = (float(stats.norm.isf(level / 2)) + _Z_POWER) * sigma
    pvalue = _count_pvalue(scores.stop_mass, emitted)
    return {
        "emitted": emitted,
        "expected": expected,
        "z": z,
        "pvalue": pvalue,
        "detectable_excess": detectable,  # stop tokens, found with probability 0.9
        "passed": bool(pvalue >= level),
    }


def _count_pvalue(chances: np.ndarray, count: int) -> float:
    """Two-sided p of `count` successes among independent trials with these chances (the
    Poisson-binomial law, by dynamic programming over the trials that are neither sure nor
    impossible): 2 * the smaller tail, at most 1."""
    sure = int(np.sum(chances >= 1.0 - 1e-9))
    law = np.ones(1)
    for chance in chances[(chances > 1e-12) & (chances < 1.0 - 1e-9)]:
        law = np.concatenate([law * (1.0 - chance), [0.0]]) + np.concatenate([[0.0], law * chance])
    k = count - sure
    if k < 0 or k >= len(law):
        return 0.0
    return float(min(1.0, 2.0 * min(law[k:].sum(), law[: k + 1].sum())))


def outside_support(scores: Scores) -> dict[str, Any]:
    count = int(np.sum(scores.p <= 0.0))
    share = count / max(scores.size, 1)
    return {"count": count, "share": share, "passed": share <= OUTSIDE_SHARE}


def tests(scores: Scores, level: float = LEVEL, seed: Seed = 0) -> dict[str, Any]:
    """Every test of one program's scored tokens, and whether all passed."""
    u = pit(scores, seed)  # one draw of the noise for every test that reads u
    found = {
        "uniformity": uniformity(u, level),
        "by_offset": by_offset(u, scores.offset[scores.informative], level),
        "balance": mid_balance(scores, level),
        "stops": stop_balance(scores, level),
        "outside_support": outside_support(scores),
    }
    passed = all(t["passed"] for t in found.values())
    # the first n (doubling) at which uniformity fails: how soon a broken decode is caught
    first_failing = None if found["uniformity"]["passed"] else first_failing_prefix(u, level)
    return {
        "tokens": scores.size,
        "informative": int(np.sum(scores.informative)),
        **found,
        "caught_at": first_failing,
        "passed": passed,
    }


def caught_at(scores: Scores, level: float = LEVEL, seed: Seed = 0, start: int = 64) -> int | None:
    """The fewest informative tokens (the first n, n doubling from `start`) at which the uniformity
    test fails; None if it passes on all of them: the sample size at which a broken rule is caught."""
    return first_failing_prefix(pit(scores, seed), level, start)


def first_failing_prefix(u: np.ndarray, level: float = LEVEL, start: int = 64) -> int | None:
    """`caught_at` on u already drawn."""
    n = start
    while True:
        n = min(n, len(u))
        if stats.kstest(u[:n], "uniform").pvalue < level:
            return n
        if n == len(u):
            return None
        n *= 2


# (speculative, seed) -> (tokens [B, T], lengths [B], round offsets [B, T])
Decode = Callable[[bool, int], tuple[np.ndarray, np.ndarray, np.ndarray]]
Scorer = Callable[[np.ndarray, np.ndarray, np.ndarray], Scores]  # Decode's outputs -> Scores


def certify(
    decode: Decode,
    scorer: Scorer,
    sampling: SamplingConfig,
    seeds: Sequence[int],
    *,
    level: float = LEVEL,
    max_deviation: float = MAX_DEVIATION,
    control: bool = True,
    noise_seed: int = 0,
    keep: Callable[[str, Scores], None] | None = None,
) -> dict[str, Any]:
    """The certificate of a speculative decode: run it (and plain decoding, the control) once per
    seed, score every emitted token, test. status: 'pass', 'fail' (a test failed: the reasons
    say which) or 'inconclusive' (every test passed on fewer informative tokens than the power
    needs). Each program's PIT noise is seeded by (noise_seed, its index): a run with another seed
    draws fresh noise. `keep(name, scores)` receives each program's scores (to save them)."""
    if sampling.greedy:
        return _greedy_identity(decode, seeds)
    programs = {"speculative": True, **({"plain": False} if control else {})}
    found: dict[str, Any] = {}
    for index, (name, speculative) in enumerate(programs.items()):
        scored = Scores.concat([scorer(*decode(speculative, seed)) for seed in seeds])
        if keep is not None:
            keep(name, scored)
        found[name] = tests(scored, level, seed=(noise_seed, index))
    need = required_tokens(level, max_deviation)
    reasons = [
        f"{name}: {test} failed"
        for name, result in found.items()
        for test in TESTS
        if not result[test]["passed"]
    ]
    informative = found["speculative"]["informative"]
    short = informative < need
    status = "fail" if reasons else ("inconclusive" if short else "pass")
    if short and not reasons:
        reasons = [f"{informative} informative tokens scored, {need} needed for the power"]
    return {
        "status": status,
        "reasons": reasons,
        "level": level,
        "max_deviation": max_deviation,
        "required_tokens": need,
        "seeds": list(seeds),
        **found,
    }


def _greedy_identity(decode: Decode, seeds: Sequence[int]) -> dict[str, Any]:
    """T = 0: every row of the speculative decode against plain decoding's, token for token."""
    rows = identical = 0
    for seed in seeds[:1]:  # greedy ignores the key: one seed says all
        (spec, spec_len, _), (plain, plain_len, _) = decode(True, seed), decode(False, seed)
        for b in range(len(spec_len)):
            rows += 1
            same = spec_len[b] == plain_len[b]
            identical += bool(
                same and np.array_equal(spec[b, : spec_len[b]], plain[b, : plain_len[b]])
            )
    status = "pass" if identical == rows else "fail"
    return {
        "status": status,
        "reasons": []
        if status == "pass"
        else [f"{rows - identical} of {rows} rows differ from plain"],
        "identity": {"rows": rows, "identical": identical, "passed": status == "pass"},
    }
