"""The infer job's order of work: validate and resolve the settings, read and encode the inputs,
then under OUTPUT_DIR's lock decode what is pending (planning gamma first with GAMMA = 'auto') and
write summary.json and config.gin."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import gin
import jax

from speculative import vocab
from speculative.data import chat_inputs, inputs
from speculative.data.inputs import Example
from speculative.jobs import common
from speculative.jobs import spmd as job_spmd
from speculative.jobs.config import InferConfig
from speculative.jobs.infer import batches, decode, plan, rows, settings
from speculative.jobs.infer.settings import Settings
from speculative.loading import specs as ml
from speculative.measure import planner, tree_planner
from speculative.outputs import provenance
from speculative.outputs.job_io import ResultStore, open_result_store
from speculative.parallel import distributed

log = logging.getLogger(__name__)


def run(cfg: InferConfig) -> dict[str, Any]:
    """Runs (or resumes) the job; returns the summary also written to OUTPUT_DIR/summary.json.

    Weights are loaded only when there is something to decode or measure.
    """
    spec = settings.validate(cfg)
    job_spmd.start_distributed(cfg.multi_host)
    s = settings.resolve(cfg, spec, job_spmd.make_partitioner(cfg.partitioner))
    job_spmd.check_batch(s.models.partitioner, s.run.batch_size, "BATCH_SIZE")
    examples = batches.load_examples(s.inputs)
    vocabulary = ml.load_vocabulary(s.models.vocabulary, "vocabulary")
    encoder_decoder = ml.is_encoder_decoder(s.models.target)
    examples = chat_inputs.prepare(
        examples, vocabulary, chat=s.inputs.chat, template=s.inputs.chat_template,
        encoder_decoder=encoder_decoder,
    )  # fmt: skip
    # strict inputs: refused before any write
    encoded = batches.encode_inputs(s.inputs, examples, vocabulary, encoder_decoder)
    writer = job_spmd.is_writer()
    with common.locked_output_dir(
        s.run.output_dir, s.run.compilation_cache_dir, lock=writer
    ) as cache:
        return run_locked(s, examples, vocabulary, encoded, cache)


@dataclasses.dataclass
class Outcome:
    """What decoding left for the summary: the settings that decoded (a plan applied), the plan
    (GAMMA = 'auto'; None otherwise or when no weights were needed), whether it was reused, this
    run's stats, the measured costs and the vocabulary padding."""

    decoded: Settings
    plan: planner.Plan | None
    reused: bool
    stats: rows.RunStats = dataclasses.field(default_factory=rows.RunStats)
    costs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    padding: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def run_locked(
    s: Settings,
    examples: Sequence[Example],
    vocabulary: vocab.Vocabulary,
    encoded: Sequence[inputs.Encoded],
    cache: job_spmd.CacheStats | None = None,
) -> dict[str, Any]:
    """`run`'s work while it holds OUTPUT_DIR's lock: decode what is pending, then summarise.

    Only the writer (process 0) reads and writes OUTPUT_DIR; the other hosts decode the batches
    it finds pending and return {"process_index": i, "this_run": ...}.
    """
    job = settings.fingerprint(s, examples)
    if job_spmd.is_writer():
        store = open_result_store(s.run.output_dir, job)
    else:
        store = job_spmd.NullStore(s.run.output_dir)
    size = s.run.batch_size
    todo = batches.pending_batches(len(examples), size, store.done)
    todo = job_spmd.agree_on_pending(todo, math.ceil(len(examples) / size))
    log.info(
        f"{len(examples)} examples, {len(store.done)} already in {store.path}, {len(todo)} "
        f"batches of {size} to decode"
    )
    # GAMMA = 'auto': an earlier run's choice is reused (never re-planned), else planned below.
    reuse = plan.load_plan(store.out, job) if s.planned else None
    outcome = Outcome(s.with_plan(reuse) if reuse else s, reuse, reuse is not None)
    # c is timed on one host's devices; on several hosts it is left out.
    decoded = outcome.decoded
    timed = decoded.speculative and not decoded.planned and s.run.measure_c
    timed = timed and jax.process_count() == 1
    if todo or timed:
        outcome = decode_job(s, outcome, examples, vocabulary, encoded, todo, store, job, timed)
    if not job_spmd.is_writer():
        return {"process_index": jax.process_index(), "this_run": outcome.stats.to_json()}
    return write_summary(s, outcome, store, cache)


def decode_job(
    s: Settings,
    outcome: Outcome,
    examples: Sequence[Example],
    vocabulary: vocab.Vocabulary,
    encoded: Sequence[inputs.Encoded],
    todo: Sequence[int],
    store: ResultStore,
    job: Mapping[str, Any],
    timed: bool,
) -> Outcome:
    """Loads the models, plans gamma if it must, decodes the pending batches and times c."""
    ids = [e.ids for e in encoded]
    models = decode.load_models(s, vocabulary, ids)
    batches.check_context(decode.context_models(models), ids, s.inputs.max_decode_len)
    outcome = dataclasses.replace(outcome, padding=models.vocab_padding)
    if outcome.decoded.planned:
        planning = s.speculation.planning
        deepest = max(planning.gammas)
        # the probe tree's block is the largest the planner decodes (TREE = 'auto')
        block = deepest * tree_planner.PROBE_WIDTH if planning.trees else deepest
        log.info(decode.memory_report(s, models, ids, block))
        chosen = plan.plan_gamma(
            s,
            functools.partial(models.decoder, partitioner=s.models.partitioner),
            s.decode_config(vocabulary),
            ids,
            functools.partial(decode.nan_error, s, examples),
        )
        plan.save_plan(store.out, job, chosen)
        outcome = dataclasses.replace(
            outcome, decoded=s.with_plan(chosen), plan=chosen, costs=plan.plan_costs(chosen)
        )
        timed = False
    else:
        log.info(decode.memory_report(s, models, ids, outcome.decoded.gamma))
    if outcome.plan is not None:
        log.info(outcome.plan.describe() + (" (reused from plan.json)" if outcome.reused else ""))
        if outcome.plan.gamma is None:
            log.info("planner: decoding plainly, as SPECULATIVE = False would")
    decoded = outcome.decoded
    if not decoded.speculative:
        models, outcome = models.plain(), dataclasses.replace(outcome, costs={})
    config = decoded.decode_config(vocabulary)
    decoder = models.decoder(config, s.models.partitioner)
    stats = decode.decode_pending(decoded, examples, encoded, todo, decoder, vocabulary, store)
    outcome = dataclasses.replace(outcome, stats=stats)
    if timed:
        outcome = dataclasses.replace(
            outcome, costs=decode.measure_cost(decoded, models, config, ids[0])
        )
    return outcome


def write_summary(
    s: Settings, outcome: Outcome, store: ResultStore, cache: job_spmd.CacheStats | None
) -> dict[str, Any]:
    """summary.json and config.gin in OUTPUT_DIR, and the summary printed."""
    summary = rows.job_summary(outcome.decoded, store.rows(), outcome.stats, outcome.costs)
    if s.planned:
        plan_json = None if outcome.plan is None else outcome.plan.to_json()
        summary["planner"] = None if plan_json is None else {**plan_json, "reused": outcome.reused}
    if outcome.padding:
        summary["vocab_padding"] = outcome.padding
    if s.models.partitioner is not None:
        summary["partitioner"] = job_spmd.describe(s.models.partitioner)
    if cache is not None and cache.dir:
        summary["compilation_cache"] = cache.to_json()
    store.finish()  # on a store: predictions.jsonl from the committed chunks
    config = gin.operative_config_str()
    summary["provenance"] = provenance.record(config)
    summary["environment"] = provenance.environment()
    store.out.write_text("summary.json", json.dumps(summary, indent=2))
    store.out.write_text("config.gin", config)
    rows.print_summary(summary, store.out)
    return summary


def make_config() -> InferConfig:
    """InferConfig from gin, after `distributed.initialize` (gin: enabled = %DISTRIBUTED): a
    PARTITIONER's mesh must see every host's devices."""
    distributed.initialize()
    return InferConfig()
