"""The certificate job's order of work: build the prompts and check every setting and the power
(before any weights load), load the pair, then `certify_pair`: each seed's batch decoded
speculatively and plainly, every emitted token scored by the target, the tests
(`measure.certificate`), and OUTPUT_DIR/certificate.json with the configuration, statistics,
sample sizes, provenance and environment. The notebook's `Pair.certify` runs `certify_pair` too.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import gin
import jax
import numpy as np

from speculative import decoding, vocab
from speculative.data import chat_inputs, inputs, spec_bench
from speculative.errors import JobError
from speculative.jobs import pairs
from speculative.jobs.certify.config import CertifyConfig, SamplePlan
from speculative.loading import specs as ml
from speculative.measure import certificate
from speculative.outputs import provenance
from speculative.outputs.job_io import hold_output_dir

log = logging.getLogger(__name__)


def certify_pair(
    pair: pairs.LoadedPair,
    ids: Sequence[Sequence[int]],
    texts: Sequence[str] | None,
    plain: decoding.DecodeConfig,
    drafting: decoding.DecodeConfig,
    plan: SamplePlan,
    seed: int = 0,
    keep: Callable[[str, certificate.Scores], None] | None = None,
) -> dict[str, Any]:
    """The certificate of `pair`'s speculative decode by `drafting` (its sampling; plain decoding
    by `plain` the control), sampled and tested by `plan`; `seed` keys the decodes and the PIT
    noise, `keep` receives each program's scores (`certificate.certify`).
    Raises JobError before decoding when the plan cannot reach the power (`check_power`)."""
    if pair.draft is None:
        raise JobError("a certificate needs a draft: there is no speculative decode to certify")
    check_plan(len(ids), plan, drafting)
    rows_per_prompt = plan.rows_per_prompt
    sampling = drafting.sampling
    repeated = [list(p) for p in ids for _ in range(rows_per_prompt)]
    repeated_texts = None if texts is None else [t for t in texts for _ in range(rows_per_prompt)]
    batch = pair.batch(repeated, repeated_texts)
    stops = tuple(drafting.stop_ids)

    def decode(speculative: bool, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rng = jax.random.fold_in(jax.random.PRNGKey(seed), index)
        start = time.perf_counter()
        out = pair.run(batch, drafting if speculative else plain, rng, speculative)
        tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
        offsets = np.asarray(out.round_offsets)
        name = "speculative" if speculative else "plain"
        log.info(
            f"{name} seed {index}: {int(lengths.sum())} tokens, {time.perf_counter() - start:.1f} s"
        )
        return tokens, lengths, offsets

    def scorer(tokens: np.ndarray, lengths: np.ndarray, offsets: np.ndarray) -> certificate.Scores:
        target = pair.target
        return certificate.score(
            target.model, target.params, batch, tokens, lengths, sampling, stops, offsets
        )

    found = certificate.certify(
        decode, scorer, sampling, list(range(plan.seeds)), level=plan.level,
        max_deviation=plan.max_deviation, control=plan.control, noise_seed=seed, keep=keep,
    )  # fmt: skip
    sizes = {"prompts": len(ids), "rows": len(repeated), "seeds": plan.seeds, "seed": seed}
    decode_record = {
        "draft": pair.draft.description,
        "gamma": drafting.gamma,
        "tree": None if drafting.tree is None else drafting.tree.describe(),
        "acceptance": drafting.acceptance,
        "max_new_tokens": drafting.max_decode_len,
    }
    return {
        **found,
        "sampling": dataclasses.asdict(sampling),
        "decode": decode_record,
        "plan": sizes,
    }


def check_plan(prompts: int, plan: SamplePlan, drafting: decoding.DecodeConfig) -> None:
    """The sample plan refused in one line: counts that are not positive integers, or (sampled
    decoding) too few tokens at most to reach the power (`certificate.check_power`)."""
    for name in ("rows_per_prompt", "seeds"):
        value = getattr(plan, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise JobError(f"{name} must be a positive integer, got {value!r}")
    if drafting.sampling.greedy:
        return
    try:
        planned = prompts * plan.rows_per_prompt * plan.seeds * drafting.max_decode_len
        certificate.check_power(planned, plan.level, plan.max_deviation)
    except (ValueError, TypeError) as e:
        raise JobError(str(e)) from None


@dataclasses.dataclass(frozen=True)
class Prepared:
    """Everything checked before weights load."""

    ids: list[list[int]]
    texts: list[str]
    vocabulary: Any
    plain: decoding.DecodeConfig
    speculative: decoding.DecodeConfig


def prompts_of(cfg: CertifyConfig, vocabulary: Any) -> tuple[list[list[int]], list[str]]:
    """The prompts' ids and texts: PROMPTS, then the chosen questions' first turns; with `chat`,
    each a user turn through the chat template."""
    texts = list(cfg.prompts)
    if cfg.input_file is not None:
        texts += [e.inputs for e in inputs.read_examples(cfg.input_file, limit=cfg.input_limit)]
    if cfg.questions is not None:
        chosen = spec_bench.select(
            spec_bench.read_questions(cfg.questions), cfg.tasks, cfg.per_task, cfg.per_task
        )
        texts += [q.turns[0] for q in chosen]
    if not texts:
        raise JobError(
            "no prompts: set PROMPTS, INPUT_FILE (JSONL, TSV or 'humaneval') or QUESTIONS (a "
            "Spec-Bench question.jsonl)"
        )
    if not cfg.chat:
        return [vocabulary.encode(t) for t in texts], texts
    asked = chat_inputs.render(
        [inputs.Example(i, t) for i, t in enumerate(texts)],
        vocabulary,
        chat_inputs.template_for(vocabulary, cfg.chat_template),
    )
    return [list(e.ids) for e in asked], [e.inputs for e in asked]


def prepare(cfg: CertifyConfig) -> Prepared:
    """Prompts, decode settings and the power, each refused with one line, before weights load."""
    if cfg.draft is None:
        raise JobError("DRAFT is None: a certificate needs a draft to certify")
    target = pairs.model_spec(cfg.target)
    vocabulary = ml.load_vocabulary(cfg.vocabulary or pairs.vocab_spec(target), "vocabulary")
    ids, texts = prompts_of(cfg, vocabulary)
    stops = vocab.stop_ids(vocabulary)
    plain, drafting, _ = pairs.decode_configs(stops, cfg)
    check_plan(len(ids), cfg, drafting)
    return Prepared(ids, texts, vocabulary, plain, drafting)


def run(cfg: CertifyConfig) -> dict[str, Any]:
    """Runs the job; returns the certificate also written to OUTPUT_DIR/certificate.json."""
    prepared = prepare(cfg)
    code = provenance.git_state()  # the code as it was at the start
    pair = pairs.load(
        pairs.model_spec(cfg.target), pairs.model_spec(cfg.draft), cfg.vocabulary,
        prompts=prepared.ids,
    )  # fmt: skip
    return certify_loaded(cfg, prepared, pair, code)


def certify_loaded(
    cfg: CertifyConfig, prepared: Prepared, pair: pairs.LoadedPair, code: dict[str, Any]
) -> dict[str, Any]:
    """`certify_pair` of a loaded pair by `cfg`'s settings, written to OUTPUT_DIR/certificate.json
    with the settings, provenance (`code`: the git state the run started from) and environment,
    and every scored token to OUTPUT_DIR/scores.json (`certificate.Scores.to_json` by program), so
    the tests can be re-run on them without decoding again.
    A sweep of decodes of one pair (scripts/certify_sweep.py) loads it once and calls this."""
    start = time.perf_counter()
    scores: dict[str, certificate.Scores] = {}
    with hold_output_dir(cfg.output_dir) as out:
        found = certify_pair(
            pair, prepared.ids, prepared.texts, prepared.plain, prepared.speculative, cfg,
            cfg.seed, keep=scores.__setitem__,
        )  # fmt: skip
        result = {
            **found,
            "seconds": time.perf_counter() - start,
            "settings": {k: repr(v) for k, v in dataclasses.asdict(cfg).items()},
            "provenance": {**provenance.record(gin.operative_config_str()), **code},
            "environment": provenance.environment(),
        }
        out.write_text("certificate.json", json.dumps(result, indent=2))
        if scores:
            kept = {name: s.to_json() for name, s in scores.items()}
            out.write_text("scores.json", json.dumps(kept, separators=(",", ":")))
    print(summary_line(result))
    return result


def _least_place_p(program: dict[str, Any]) -> str:
    places = program["by_offset"]["places"]
    if not places:
        return "untested"
    return f"least p {min(p['pvalue'] for p in places.values()):.3g} ({len(places)} places)"


def summary_line(result: dict[str, Any]) -> str:
    """One line: the status, the tokens scored, the p-values and the power."""
    if "identity" in result:
        ident = result["identity"]
        return f"certificate {result['status']}: greedy, {ident['identical']}/{ident['rows']} rows identical to plain"
    parts = [f"certificate {result['status']}"]
    for name in ("speculative", "plain"):
        if name in result:
            r = result[name]
            parts.append(
                f"{name}: {r['tokens']} tokens ({r['informative']} informative), mid-PIT z "
                f"{r['balance']['z']:+.2f}, by place {_least_place_p(r)}, KS p "
                f"{r['uniformity']['pvalue']:.3g} "
                f"(sees {r['uniformity']['detectable_deviation']:.3f}), stops z "
                f"{r['stops']['z']:+.2f}, outside support {r['outside_support']['count']}"
            )
    return "; ".join(parts + result["reasons"])
