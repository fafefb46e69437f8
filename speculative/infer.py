"""Inference job: speculative (or plain) decoding of a dataset, configured in gin like T5X's infer.py.

    python -m speculative.infer --gin_file=configs/demo/qwen_coder_infer.gin \
        --gin.OUTPUT_DIR="'/tmp/qwen'" [--gin.SPECULATIVE=False] [--gin.GAMMA=5]

Everything is bound in gin (configs/runs/infer.gin lists the macros, `%gin.REQUIRED` ones first):
target and draft `speculative.ModelSpec`s, vocabularies, sampling, gamma, batch size, feature
lengths, the input (JSONL / TSV file, "humaneval", or a seqio Task/Mixture name) and OUTPUT_DIR.

Output, in OUTPUT_DIR:
  predictions.jsonl  one row per example: index, inputs, targets (if any), output, output_ids,
                     length, target_calls, tau; an input longer than the inputs feature length
                     adds truncated_from (its token count) and inputs_used (the text decoded
                     from); speculative rows add alpha, accepted, drafted,
                     verified, accepted_at / verified_at per draft position. Written a batch at a
                     time, fsynced; a killed job restarted with the same OUTPUT_DIR resumes
                     (speculative/job_io.py). Row results do not depend on where a run stopped:
                     batches are fixed (indices [k*B, (k+1)*B)) and batch k uses rng fold_in(seed, k).
  summary.json       totals, pooled alpha, tau, measured c and the Theorem 3.8 speedup estimate;
                     this_run times this run's decoding, each program compiled once per prompt
                     width, ahead of time and apart.
  config.gin         the operative gin config.
  plan.json          with GAMMA = 'auto': the planner's choice (gamma, or null for plain decoding)
                     and what it measured; a resumed run reuses it instead of planning again.
  With PARTITIONER (a ('data', 'model') mesh) the weights are placed on their shards, T5X
  checkpoints read shard by shard, and each batch's rows split over 'data'; with DISTRIBUTED
  every host of a pod slice runs the job, feeds its rows, and process 0 alone writes the files.
  COMPILATION_CACHE_DIR ('auto': <parent of OUTPUT_DIR>/jax_cache) keeps compiled programs
  across runs; summary.json's compilation_cache says whether this run found them (warm).
  .lock              held (fcntl) while a job runs: a second job on the same OUTPUT_DIR is refused.
With SPECULATIVE = False the target is decoded plainly with everything else equal (the draft is
not loaded, GAMMA = 'auto' is ignored); greedy outputs are then identical to the speculative ones.
GAMMA_POLICY (a decoding.GammaPolicy) sets how many of the GAMMA slots each row drafts per round.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import itertools
import json
import math
import os
import pathlib
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import gin
import jax
import numpy as np
from tqdm import tqdm

from speculative import decoding, distributed, gin_flags, inputs, job_spmd, metrics, vocab
from speculative import model_loading as ml
from speculative.decoding.drafter import Drafter
from speculative.errors import JobError
from speculative.inputs import Example
from speculative.job_config import InferConfig, check_lenience, check_num_examples
from speculative.job_io import ResultStore, examples_digest, lock_output_dir
from speculative.measure import memory, planner, runner, timing

# ------------------------------------------------------------------------------------------------
# Validation and inputs.


def validate(cfg: InferConfig) -> None:
    """Raises JobError for a config the job cannot run (before any weight or input is read)."""
    for name in ("target", "vocabulary", "output_dir"):
        if getattr(cfg, name) is gin.REQUIRED:
            raise JobError(f"speculative.InferConfig.{name} is required")
    ml.validate_model_spec(cfg.target, "target")
    ml.validate_vocab_spec(cfg.vocabulary, "vocabulary")
    if cfg.speculative:
        if cfg.draft is None:
            raise JobError(
                "SPECULATIVE is on but no draft model is bound (speculative.InferConfig.draft)"
            )
        ml.validate_model_spec(cfg.draft, "draft")
        if cfg.draft_vocabulary is not None:
            ml.validate_vocab_spec(cfg.draft_vocabulary, "draft vocabulary")
    check_gamma(cfg)
    check_lenience(cfg.lenience)
    if not isinstance(cfg.batch_size, int) or cfg.batch_size < 1:
        raise JobError(f"batch_size must be an integer >= 1, got {cfg.batch_size!r}")
    lengths = dict(cfg.feature_lengths)
    if set(lengths) != {"inputs", "targets"} or min(lengths.values()) < 1:
        raise JobError(
            f"feature_lengths must be {{'inputs': n, 'targets': m}} (>= 1), got {lengths}"
        )
    if (cfg.input_file is None) == (cfg.mixture_or_task_name is None):
        raise JobError("bind exactly one of INPUT_FILE and MIXTURE_OR_TASK_NAME")
    check_num_examples(cfg.num_examples)
    if cfg.multi_host and cfg.partitioner is None:
        raise JobError(
            "DISTRIBUTED (multi_host) needs a PARTITIONER mesh over every host's devices"
        )


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_gamma(cfg: InferConfig) -> None:
    """Raises JobError unless GAMMA is an int >= 1 or 'auto' (with sane planner settings) and
    GAMMA_POLICY is a GammaPolicy. 'auto' with SPECULATIVE = False is ignored: plain decoding
    was asked for, so there is nothing to plan."""
    if not (_is_count(cfg.gamma) or cfg.gamma == "auto"):
        raise JobError(f"GAMMA must be an integer >= 1 or 'auto', got {cfg.gamma!r}")
    if not isinstance(cfg.gamma_policy, decoding.GammaPolicy):
        raise JobError(f"GAMMA_POLICY must be a @decoding.GammaPolicy(), got {cfg.gamma_policy!r}")
    if cfg.gamma != "auto" or not cfg.speculative:
        return
    gammas = cfg.planner_gammas
    if isinstance(gammas, (str, bytes)) or not gammas or not all(map(_is_count, gammas)):
        raise JobError(f"planner_gammas must be integers >= 1, got {gammas!r}")
    if not _is_count(cfg.planner_warmup_gamma):
        raise JobError(
            f"planner_warmup_gamma must be an integer >= 1, got {cfg.planner_warmup_gamma!r}"
        )
    if cfg.multi_host:  # every host would have to time the models and agree on one choice
        raise JobError("GAMMA = 'auto' needs one host; bind an integer GAMMA with DISTRIBUTED")


def load_examples(cfg: InferConfig) -> list[Example]:
    """The job's examples: the input file's, or the seqio Task's after its registration."""
    if cfg.input_file is not None:
        return inputs.read_examples(
            cfg.input_file,
            input_field=cfg.input_field,
            target_field=cfg.target_field,
            limit=cfg.num_examples,
        )
    inputs.require_seqio()
    if cfg.task_module:
        importlib.import_module(cfg.task_module)
    if cfg.task_setup is not None:
        cfg.task_setup()
    return inputs.read_task(
        cfg.mixture_or_task_name, cfg.task_split, dict(cfg.feature_lengths), cfg.num_examples
    )


def decode_config(cfg: InferConfig, vocabulary: vocab.Vocabulary) -> decoding.DecodeConfig:
    return decoding.DecodeConfig(
        max_decode_len=cfg.feature_lengths["targets"],
        stop_ids=vocab.stop_ids(vocabulary),
        sampling=cfg.sampling,
        gamma=cfg.gamma if cfg.speculative else None,
        lenience=float(cfg.lenience) if cfg.speculative else 1.0,
        gamma_policy=cfg.gamma_policy,
    )


@dataclasses.dataclass(frozen=True)
class Models:
    """What the job decodes with; draft is None for plain decoding."""

    target: ml.Loaded
    draft: ml.Loaded | None
    vocab_padding: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def encoder_decoder(self) -> bool:
        return self.target.model.is_encoder_decoder

    def decoder(self, config: decoding.DecodeConfig, partitioner: Any = None) -> runner.Decoder:
        target = (self.target.model, self.target.params, config)
        if self.draft is None:
            return runner.Decoder(*target, partitioner=partitioner)
        return runner.Decoder(*target, self.draft.model, self.draft.params, partitioner)


def load_models(cfg: InferConfig, vocabulary: vocab.Vocabulary) -> Models:
    """The target (and draft), checked against the vocabulary, padding ids masked out; on their
    shards when cfg.partitioner is set."""
    mesh = {} if cfg.partitioner is None else {"partitioner": cfg.partitioner}
    loaded = {"target": (ml.load_model(cfg.target, "target", **mesh), ml.where(cfg.target))}
    draft_spec = isinstance(cfg.draft, ml.DraftSpec)
    if cfg.speculative and not draft_spec:
        loaded["draft"] = (ml.load_model(cfg.draft, "draft", **mesh), ml.where(cfg.draft))
    if cfg.speculative:
        ml.check_draft_vocabulary(cfg.draft_vocabulary, vocabulary)
    fitted, padding = ml.fit_vocabulary(vocabulary, ml.where(cfg.vocabulary), loaded)
    if cfg.speculative and draft_spec:  # built for the fitted target's width
        fitted["draft"] = ml.build_draft(cfg.draft, fitted["target"])
    return Models(fitted["target"], fitted.get("draft"), padding)


def encode_inputs(
    cfg: InferConfig, examples: Sequence[Example], vocabulary: vocab.Vocabulary
) -> list[inputs.Encoded]:
    """Token ids of every example; with strict_inputs, a JobError for one longer than allowed."""
    limit = cfg.feature_lengths["inputs"]
    encoded = inputs.encode(examples, vocabulary, ml.is_encoder_decoder(cfg.target), limit)
    long = [(ex, e) for ex, e in zip(examples, encoded) if e.truncated]
    if long and cfg.strict_inputs:
        ex, e = long[0]
        where = ex.source or f"{cfg.mixture_or_task_name}[{ex.index}]"
        raise JobError(
            f"input {ex.index} has {e.full_length} tokens, more than the inputs feature length "
            f"{limit} (strict_inputs; {len(long)} input(s) too long): shorten it, raise "
            "TASK_FEATURE_LENGTHS['inputs'], or turn strict inputs off to truncate",
            role="input",
            path=where,
        )
    if long:
        print(
            f"{len(long)} input(s) longer than {limit} tokens are truncated (first: input "
            f"{long[0][0].index}, {long[0][1].full_length} tokens); rows record truncated_from"
        )
    return encoded


def check_context(models: Models, ids: Sequence[Sequence[int]], max_decode_len: int) -> None:
    """Raises JobError when a decoder-only prompt plus the generated tokens outgrow a model."""
    if models.encoder_decoder:
        return
    limits = [
        getattr(m.model, "max_length", None) for m in (models.target, models.draft) if m is not None
    ]
    limits = [x for x in limits if x is not None]
    need = max(len(x) for x in ids) + max_decode_len
    if limits and need > min(limits):
        raise JobError(
            f"longest prompt + targets length = {need} tokens exceeds the model context "
            f"{min(limits)}"
        )


def pending_batches(count: int, batch_size: int, done: Mapping[int, Any]) -> list[int]:
    """Batch numbers k (rows [k*B, (k+1)*B)) with a row not written yet."""
    return [
        k
        for k in range(math.ceil(count / batch_size))
        if any(i not in done for i in range(k * batch_size, min(count, (k + 1) * batch_size)))
    ]


# ------------------------------------------------------------------------------------------------
# Rows and summaries.


def output_rows(
    examples: Sequence[Example],
    out: decoding.DecodeOutput,
    vocabulary: vocab.Vocabulary,
    speculative: bool,
    encoded: Sequence[inputs.Encoded] | None = None,
) -> list[dict[str, Any]]:
    """One JSON-able row per example from the first len(examples) rows of `out`; a truncated
    input (per `encoded`) records its token count and the text decoded from."""
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    stats = jax.tree.map(np.asarray, out.stats)
    alpha, tau = np.asarray(stats.alpha), np.asarray(stats.tokens_per_call)
    rows = []
    for i, ex in enumerate(examples):
        ids = [int(t) for t in tokens[i, : int(lengths[i])]]
        text_ids = ids[:-1] if ids and ids[-1] == vocabulary.eos_id else ids
        row: dict[str, Any] = {"index": ex.index, **dict(ex.extra), "inputs": ex.inputs}
        if ex.targets is not None:
            row["targets"] = ex.targets
        if encoded is not None and encoded[i].truncated:
            row["truncated_from"] = encoded[i].full_length
            row["inputs_used"] = vocabulary.decode(encoded[i].ids)
        row.update(
            output=vocabulary.decode(text_ids),
            output_ids=ids,
            length=len(ids),
            target_calls=int(stats.target_calls[i]),
            tau=float(tau[i]),
            exact=bool(out.exact),
            lenience=float(out.lenience),
        )
        if speculative:
            row.update(
                alpha=float(alpha[i]),
                accepted=int(stats.accepted[i]),
                drafted=int(stats.drafted[i]),
                draft_calls=int(stats.draft_calls[i]),
                verified=int(stats.verified_at[i].sum()),
                accepted_at=[int(x) for x in stats.accepted_at[i]],
                verified_at=[int(x) for x in stats.verified_at[i]],
            )
        rows.append(row)
    return rows


_SPECULATIVE_COLUMNS = ("alpha", "accepted", "drafted", "draft_calls", "accepted_at", "verified_at")


def summarize_rows(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Totals over output rows, pooled by `metrics.summarize`: examples, tokens, target calls,
    tau, and (speculative rows) alpha, accepted, drafted, acceptance per draft position."""
    names = ("target_calls",)
    if rows and "alpha" in rows[0]:  # rows on disk: plain ones have no speculative fields
        names += _SPECULATIVE_COLUMNS
    columns = {name: np.asarray([r[name] for r in rows]) for name in names}
    lengths = np.asarray([r["length"] for r in rows], np.int64)
    return {"examples": len(rows), **metrics.summarize(columns, lengths)}


def pool_rows(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Speculative output rows pooled into one row of the same form (counts summed, alpha by
    `summarize_rows`). Pooling is associative: the pool of [pool_rows(a)] + b is the pool of a + b,
    which lets a running total take O(batch) work per batch."""
    s = summarize_rows(rows)
    return {
        "length": s["tokens"],
        **{k: s[k] for k in ("target_calls", "alpha", "accepted", "drafted", "draft_calls")},
        "accepted_at": np.sum([r["accepted_at"] for r in rows], axis=0),
        "verified_at": np.sum([r["verified_at"] for r in rows], axis=0),
    }


def fingerprint(cfg: InferConfig, examples: Sequence[Example]) -> dict[str, Any]:
    """What determines every row's result: a restart must match it to resume."""
    return {
        "target": ml.describe(cfg.target),
        "draft": ml.describe(cfg.draft) if cfg.speculative else None,
        "speculative": cfg.speculative,
        "gamma": cfg.gamma if cfg.speculative else None,
        # only when lossy, so exact runs resume in output dirs written before lenience existed
        **({"lenience": cfg.lenience} if cfg.speculative and cfg.lenience != 1 else {}),
        # likewise only when adaptive or planned: older output dirs keep resuming
        **({"gamma_policy": policy_fields(cfg)} if cfg.speculative and adaptive(cfg) else {}),
        **(planner_fields(cfg) if planned(cfg) else {}),
        "sampling": dataclasses.asdict(cfg.sampling),
        "batch_size": cfg.batch_size,
        "feature_lengths": dict(cfg.feature_lengths),
        "seed": cfg.seed,
        "examples": len(examples),
        "inputs_sha256": examples_digest(examples),
    }


def adaptive(cfg: InferConfig) -> bool:
    return cfg.gamma_policy.adaptive


def planned(cfg: InferConfig) -> bool:
    """Whether the job picks gamma itself (GAMMA = 'auto', speculative)."""
    return cfg.speculative and cfg.gamma == "auto"


def policy_fields(cfg: InferConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg.gamma_policy)


def planner_fields(cfg: InferConfig) -> dict[str, Any]:
    return {
        "planner_gammas": [int(g) for g in cfg.planner_gammas],
        "planner_warmup_gamma": cfg.planner_warmup_gamma,
    }


# ------------------------------------------------------------------------------------------------
# GAMMA = 'auto': the planner's choice, made once per output directory.

PLAN = "plan.json"


def load_plan(out_dir: pathlib.Path, job: Mapping[str, Any]) -> planner.Plan | None:
    """The plan an earlier run of this same job made (None if none, or another job's)."""
    path = out_dir / PLAN
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    if record.get("fingerprint") != json.loads(json.dumps(job)):  # a job that took the dir over
        return None
    return planner.Plan.from_json(record["plan"])


def save_plan(out_dir: pathlib.Path, job: Mapping[str, Any], plan: planner.Plan) -> None:
    """Written (atomically) before any row, so every row of the job uses the same choice."""
    tmp = out_dir / f"{PLAN}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"fingerprint": job, "plan": plan.to_json()}, indent=2))
    os.replace(tmp, out_dir / PLAN)


def apply_plan(cfg: InferConfig, plan: planner.Plan) -> InferConfig:
    """The config that runs: the planned gamma, or plain decoding (as SPECULATIVE = False)."""
    if plan.gamma is None:
        return dataclasses.replace(cfg, speculative=False)
    return dataclasses.replace(cfg, gamma=plan.gamma)


def plan_gamma(
    cfg: InferConfig,
    models: Models,
    vocabulary: vocab.Vocabulary,
    examples: Sequence[Example],
    ids: Sequence[Sequence[int]],
) -> planner.Plan:
    """`planner.plan` from alpha on batch 0 decoded at planner_warmup_gamma (its rows are not
    kept: batch 0 is decoded again with the choice) and the costs timed on that batch."""
    warmup = decode_config(dataclasses.replace(cfg, gamma=cfg.planner_warmup_gamma), vocabulary)
    decoder = models.decoder(warmup, cfg.partitioner)
    first = next(job_batches(cfg, ids, [0], decoder))
    try:
        result = next(runner.run_batches({"warmup": decoder}, [(first.batch, first.rng)]))
    except FloatingPointError as e:
        raise nan_error(cfg, examples, first.members, e) from e
    rows = len(first.members)  # a short batch 0 repeats its last row
    stats = jax.tree.map(lambda x: np.asarray(x)[:rows], result.outputs["warmup"].stats)
    target, draft = models.target, models.draft
    costs = planner.measure_costs(
        target.model, target.params, draft.model, draft.params, first.batch, warmup,
        cfg.planner_gammas,
    )  # fmt: skip
    return planner.plan_from_costs(planner.pooled_alpha(stats), costs)


def plan_costs(plan: planner.Plan) -> dict[str, Any]:
    """The step costs the plan measured, as `measure_cost` reports them (not timed twice)."""
    fields = plan.to_json()
    return {k: fields[k] for k in ("target_step_s", "draft_step_s", "c")}


# ------------------------------------------------------------------------------------------------
# Decoding the pending batches.


@dataclasses.dataclass
class RunStats:
    """What this run decoded (summary.json's "this_run"); seconds exclude compilation."""

    decoded_examples: int = 0
    decoded_tokens: int = 0
    decode_s: float = 0.0
    compile_batches: int = 0  # batches that compiled a program first (one per prompt width)
    compile_s: float = 0.0  # seconds compiling them (low when the compilation cache is warm)

    @property
    def tokens_per_s(self) -> float | None:
        return self.decoded_tokens / self.decode_s if self.decode_s else None

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "tokens_per_s": self.tokens_per_s}


@dataclasses.dataclass(frozen=True)
class JobBatch:
    """Batch k of the job: its real rows (members) and the padded batch decoded for them."""

    number: int
    members: list[int]
    batch: dict[str, jax.Array]
    rng: jax.Array


def job_batches(
    cfg: InferConfig, ids: Sequence[Sequence[int]], todo: Sequence[int], decoder: runner.Decoder
) -> Iterator[JobBatch]:
    """The pending batches, built lazily: fixed rows [k*B, (k+1)*B) (a short last batch repeats its
    last row), each padded to its own bucket width, batch k with rng fold_in(seed, k)."""
    rows = inputs.consecutive_rows(len(ids), cfg.batch_size)
    # On a mesh, this host builds only its rows (all of them on one host); the width is the
    # whole batch's, so every host pads alike.
    local = (
        slice(None)
        if cfg.partitioner is None
        else job_spmd.local_rows(cfg.partitioner, cfg.batch_size)
    )
    for k in todo:
        members = list(dict.fromkeys(rows[k]))
        width = inputs.bucket(max(len(ids[i]) for i in members), cfg.feature_lengths["inputs"])
        batch = inputs.make_batch(
            [ids[i] for i in rows[k][local]], decoder.target.is_encoder_decoder, width
        )
        try:
            decoder.validate(batch)
        except ValueError as e:
            raise JobError(f"batch {k}: {e}") from e
        if cfg.partitioner is not None:
            batch = job_spmd.place_batch(cfg.partitioner, batch, cfg.batch_size)
        yield JobBatch(k, members, batch, jax.random.fold_in(jax.random.PRNGKey(cfg.seed), k))


def nan_error(
    cfg: InferConfig,
    examples: Sequence[Example],
    members: Sequence[int],
    error: FloatingPointError | None = None,
) -> JobError:
    """NaN logits of the target or the draft (decoding.NaNLogitsError says whose)."""
    role = "draft" if getattr(error, "role", "target") == "draft" else "target"
    indices = ", ".join(str(examples[i].index) for i in members)
    return JobError(
        f"NaN logits while decoding input(s) {indices}: corrupt weights, or a dtype too narrow "
        "for the model (try DTYPE = 'float32')",
        role=role,
        path=_where(cfg.draft if role == "draft" else cfg.target),
    )


def _where(spec: Any) -> str:
    return ml.where(spec) if isinstance(spec, ml.ModelSpec) else ml.describe(spec)


def decode_pending(
    cfg: InferConfig,
    examples: Sequence[Example],
    encoded: Sequence[inputs.Encoded],
    todo: Sequence[int],
    decoder: runner.Decoder,
    vocabulary: vocab.Vocabulary,
    store: ResultStore,
) -> RunStats:
    """Decodes the pending batches, appending each batch's rows to the store as it finishes."""
    ids = [e.ids for e in encoded]
    stats, writer = RunStats(), job_spmd.is_writer()
    spec_rows = [r for r in store.rows() if "alpha" in r]
    pooled = pool_rows(spec_rows) if spec_rows else None  # the progress bar's running alpha
    bar = tqdm(
        total=len(examples),
        initial=len(store.done),
        unit="ex",
        disable=not (cfg.progress and writer),
        file=sys.stderr,
    )
    # Built lazily, one batch ahead of the decoding: tee keeps the batch beside its result.
    pending, to_run = itertools.tee(job_batches(cfg, ids, todo, decoder))
    runs = runner.run_batches({"decode": decoder}, ((b.batch, b.rng) for b in to_run))
    for job_batch in pending:
        try:
            result = next(runs)
        except FloatingPointError as e:
            raise nan_error(cfg, examples, job_batch.members, e) from e
        out = result.outputs["decode"]
        stats.decode_s += result.seconds["decode"]
        stats.compile_batches += "decode" in result.compile_s
        stats.compile_s += result.compile_s.get("decode", 0.0)
        if cfg.partitioner is not None:  # every host takes part; host 0 gets the rows
            out = distributed.gather_to_host0(out)
        if not writer:  # host 0 writes the rows
            continue
        members = job_batch.members
        rows = output_rows(
            [examples[i] for i in members],
            out,
            vocabulary,
            cfg.speculative,
            [encoded[i] for i in members],
        )
        rows = [r for r in rows if r["index"] not in store.done]  # a torn batch's survivors stay
        store.append(rows)
        stats.decoded_examples += len(rows)
        stats.decoded_tokens += sum(r["length"] for r in rows)
        postfix = {"tok/s": f"{stats.tokens_per_s:.1f}" if stats.decode_s else "compiling"}
        if cfg.speculative and rows:
            pooled = pool_rows(([pooled] if pooled else []) + rows)
            postfix["alpha"] = f"{pooled['alpha']:.3f}"
        bar.set_postfix(postfix)
        bar.update(len(rows))
    bar.close()
    return stats


def measure_cost(
    cfg: InferConfig, models: Models, config: decoding.DecodeConfig, ids: Sequence[int]
) -> dict[str, Any]:
    """c (draft step / target step) on a batch of the first input, and Thm 3.8's estimates."""
    width = inputs.bucket(len(ids), cfg.feature_lengths["inputs"])
    probe = inputs.make_batch([ids] * cfg.batch_size, models.encoder_decoder, width)
    target, draft = models.target, models.draft
    cache_len = config.cache_length(target.model, probe)
    return timing.measure_c(
        target.model,
        target.params,
        draft.model,
        draft.params,
        probe,
        cache_len,
        draft_config=config,
    )


# ------------------------------------------------------------------------------------------------
# The job.


def run(cfg: InferConfig) -> dict[str, Any]:
    """Runs (or resumes) the job; returns the summary also written to OUTPUT_DIR/summary.json.

    Weights are loaded only when there is something to decode or measure.
    """
    validate(cfg)
    job_spmd.start_distributed(cfg.multi_host)
    cfg = dataclasses.replace(cfg, partitioner=job_spmd.make_partitioner(cfg.partitioner))
    job_spmd.check_batch(cfg.partitioner, cfg.batch_size, "BATCH_SIZE")
    examples = load_examples(cfg)
    vocabulary = ml.load_vocabulary(cfg.vocabulary, "vocabulary")
    encoded = encode_inputs(cfg, examples, vocabulary)  # strict inputs: refused before any write
    cache_dir = job_spmd.cache_dir(cfg.compilation_cache_dir, cfg.output_dir)
    lock = lock_output_dir(cfg.output_dir) if job_spmd.is_writer() else contextlib.nullcontext()
    with lock, job_spmd.compilation_cache(cache_dir) as cache:
        return run_locked(cfg, examples, vocabulary, encoded, cache)


def run_locked(
    cfg: InferConfig,
    examples: Sequence[Example],
    vocabulary: vocab.Vocabulary,
    encoded: Sequence[inputs.Encoded],
    cache: job_spmd.CacheStats | None = None,
) -> dict[str, Any]:
    """`run`'s work while it holds OUTPUT_DIR's lock: decode what is pending, then summarise.

    Only the writer (process 0) reads and writes OUTPUT_DIR; the other hosts decode the batches
    it finds pending and return {"process_index": i, "this_run": ...}.
    """
    writer = job_spmd.is_writer()
    job = fingerprint(cfg, examples)
    if writer:
        store = ResultStore(cfg.output_dir, job)
    else:
        store = job_spmd.NullStore(cfg.output_dir)
    todo = pending_batches(len(examples), cfg.batch_size, store.done)
    todo = job_spmd.agree_on_pending(todo, math.ceil(len(examples) / cfg.batch_size))
    print(
        f"{len(examples)} examples, {len(store.done)} already in {store.path}, {len(todo)} "
        f"batches of {cfg.batch_size} to decode"
    )
    # GAMMA = 'auto': an earlier run's choice is reused (never re-planned), else planned below.
    plan = load_plan(store.dir, job) if planned(cfg) else None
    reused = plan is not None
    run_cfg = apply_plan(cfg, plan) if plan else cfg  # the config that decodes
    stats, costs, padding = RunStats(), {}, {}
    # c is timed on one host's devices; on several hosts it is left out.
    measure_c = (
        run_cfg.speculative and not planned(run_cfg) and cfg.measure_c and jax.process_count() == 1
    )
    if todo or measure_c:
        models = load_models(cfg, vocabulary)
        padding = models.vocab_padding
        ids = [e.ids for e in encoded]
        if models.draft is not None:  # a shortlist head is fitted to every prompt of the job
            draft = ml.with_shortlist(models.draft, cfg.draft, vocabulary, ids)
            models = dataclasses.replace(models, draft=draft)
        check_context(models, ids, cfg.feature_lengths["targets"])
        if planned(run_cfg):
            print(
                memory_report(dataclasses.replace(cfg, gamma=max(cfg.planner_gammas)), models, ids)
            )
            plan = plan_gamma(cfg, models, vocabulary, examples, ids)
            save_plan(store.dir, job, plan)
            run_cfg, costs, measure_c = apply_plan(cfg, plan), plan_costs(plan), False
        else:
            print(memory_report(run_cfg, models, ids))
        if plan is not None:
            print(plan.describe() + (" (reused from plan.json)" if reused else ""))
            if plan.gamma is None:
                print("planner: decoding plainly, as SPECULATIVE = False would")
        if not run_cfg.speculative:
            models = dataclasses.replace(models, draft=None)
            costs = {}
        config = decode_config(run_cfg, vocabulary)
        decoder = models.decoder(config, cfg.partitioner)
        stats = decode_pending(run_cfg, examples, encoded, todo, decoder, vocabulary, store)
        if measure_c:
            costs = measure_cost(run_cfg, models, config, ids[0])
    if not writer:
        return {"process_index": jax.process_index(), "this_run": stats.to_json()}
    summary = job_summary(run_cfg, store.rows(), stats, costs)
    if planned(cfg):
        summary["planner"] = None if plan is None else {**plan.to_json(), "reused": reused}
    if padding:
        summary["vocab_padding"] = padding
    if cfg.partitioner is not None:
        summary["partitioner"] = job_spmd.describe(cfg.partitioner)
    if cache is not None and cache.dir:
        summary["compilation_cache"] = cache.to_json()
    (store.dir / "summary.json").write_text(json.dumps(summary, indent=2))
    (store.dir / "config.gin").write_text(gin.operative_config_str())
    print_summary(summary, store.dir)
    return summary


def memory_report(cfg: InferConfig, models: Models, ids: Sequence[Sequence[int]]) -> str:
    draft = models.draft.model if models.draft is not None else None
    if isinstance(draft, Drafter):  # not a separate model: no weights or cache of its own
        draft = None
    return memory.job_report(
        models.target.model,
        draft,
        batch_size=cfg.batch_size,
        input_len=max(len(x) for x in ids),
        max_decode_len=cfg.feature_lengths["targets"],
        gamma=cfg.gamma if cfg.speculative else 0,
        param_dtype=jax.tree.leaves(models.target.params)[0].dtype,
        mesh_shape=None if cfg.partitioner is None else cfg.partitioner.mesh_shape,
    )


def lenience_fields(cfg: InferConfig) -> dict[str, Any]:
    """{"exact": bool, "lenience": l}: l < 1 (speculative only) is lossy."""
    lenience = float(cfg.lenience) if cfg.speculative else 1.0
    return {"exact": lenience == 1.0, "lenience": lenience}


def job_summary(
    cfg: InferConfig,
    rows: Sequence[Mapping[str, Any]],
    stats: RunStats,
    costs: Mapping[str, Any],
) -> dict[str, Any]:
    """summary.json: the job, its rows pooled, this run, and (with costs) Thm 3.8's estimates."""
    summary = {
        "target": ml.describe(cfg.target),
        "draft": ml.describe(cfg.draft) if cfg.speculative else None,
        "speculative": cfg.speculative,
        "gamma": cfg.gamma if cfg.speculative else None,
        "gamma_policy": policy_fields(cfg) if cfg.speculative else None,
        **lenience_fields(cfg),
        "batch_size": cfg.batch_size,
        "sampling": dataclasses.asdict(cfg.sampling),
        "feature_lengths": dict(cfg.feature_lengths),
        **summarize_rows(rows),
        "truncated_inputs": sum("truncated_from" in r for r in rows),
        "this_run": stats.to_json(),
    }
    if costs and "alpha" in summary:
        alpha = summary["alpha"]
        summary.update(
            costs,
            predicted_speedup=metrics.predicted_speedup(alpha, cfg.gamma, costs["c"]),
            optimal_gamma=metrics.optimal_gamma(alpha, costs["c"]),
        )
    return summary


def print_summary(s: Mapping[str, Any], out_dir) -> None:
    mode = f"speculative, gamma {s['gamma']}" if s["speculative"] else "plain decoding"
    policy = s.get("gamma_policy") or {}
    if policy.get("kind", "fixed") != "fixed":
        mode += f" (at most; {policy['kind']} gamma policy)"
    if s.get("planner"):
        p = s["planner"]
        mode += f", planned (alpha {p['alpha']:.3f}, predicted {p['predicted_speedup']:.2f}x)"
    print(f"\n{s['target']}\n  {mode}, batch {s['batch_size']}, {s['sampling']}")
    if s["speculative"]:
        print(f"  draft: {s['draft']}")
    if not s["exact"]:
        print(f"  LOSSY: lenient acceptance, lenience {s['lenience']} (exact: false)")
    print(
        f"  {s['examples']} examples, {s['tokens']} tokens, {s['target_calls']} target calls, "
        f"tau {s['tau']:.2f}"
    )
    if "alpha" in s:
        print(f"  alpha {s['alpha']:.3f}, accepted {s['accepted']} / drafted {s['drafted']}")
    if s["truncated_inputs"]:
        print(f"  {s['truncated_inputs']} input(s) truncated (rows with truncated_from)")
    r = s["this_run"]
    if r["tokens_per_s"]:
        print(
            f"  this run: {r['decoded_tokens']} tokens, {r['tokens_per_s']:.1f} tok/s "
            "(compilation excluded)"
        )
    if r["compile_batches"]:
        cache = s.get("compilation_cache")
        state = ""
        if cache:
            warmth = "warm" if cache["warm"] else "cold" if not cache["hits"] else "partly warm"
            state = f", cache {warmth} ({cache['hits']} hits, {cache['misses']} misses)"
        print(f"  compiled {r['compile_batches']} program(s) in {r['compile_s']:.1f}s{state}")
    if "c" in s:
        print(
            f"  c {s['c']:.3f} -> Theorem 3.8 speedup estimate {s['predicted_speedup']:.2f}x "
            f"(optimal gamma {s['optimal_gamma']})"
        )
    print(f"  wrote {out_dir}/predictions.jsonl, summary.json, config.gin")


def make_config() -> InferConfig:
    """InferConfig from gin, after `distributed.initialize` (gin: enabled = %DISTRIBUTED): a
    PARTITIONER's mesh must see every host's devices."""
    distributed.initialize()
    return InferConfig()


def main(argv: Sequence[str]) -> dict[str, Any] | None:
    return gin_flags.configure_and_run(argv, __doc__.split("\n\n")[0], make_config, run)


if __name__ == "__main__":
    sys.exit(gin_flags.run_job(main))
