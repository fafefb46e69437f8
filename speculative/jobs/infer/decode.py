"""The infer job's decoding: its models (loaded by `jobs.common`), the pending batches decoded and
appended to the output a batch at a time, c timed after them, and the memory report."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from tqdm import tqdm

from speculative import decoding, vocab
from speculative.data import inputs
from speculative.data.inputs import Example
from speculative.errors import JobError
from speculative.jobs import common
from speculative.jobs import spmd as job_spmd
from speculative.jobs.infer.batches import invalid_batch, job_batches
from speculative.jobs.infer.rows import RunStats, output_rows, pool_rows
from speculative.jobs.infer.settings import Settings
from speculative.loading import specs as ml
from speculative.measure import memory, runner, timing
from speculative.outputs.job_io import ResultStore
from speculative.parallel import distributed


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
        try:
            return runner.Decoder(*target, self.draft.model, self.draft.params, partitioner)
        except ValueError as e:  # e.g. a TREE this draft cannot grow
            raise JobError(f"draft: {e}") from None

    def plain(self) -> Models:
        return dataclasses.replace(self, draft=None)


def _drafts(s: Settings) -> list[tuple[str, Any]]:
    return [] if s.draft is None else [("draft", s.draft)]


def load_models(s: Settings, vocabulary: vocab.Vocabulary, ids: Sequence[Sequence[int]]) -> Models:
    """The target (and draft), checked against the vocabulary, padding ids masked out, the draft's
    shortlist head fitted to every prompt of the job; on their shards with a partitioner."""
    drafts = _drafts(s)
    m = s.models
    loaded = common.load_models(
        m.target, drafts, vocabulary, m.vocabulary, s.draft_vocabulary, m.partitioner
    )
    loaded = common.prepare_drafts(loaded, drafts, vocabulary, ids)
    draft = loaded.drafts[0] if loaded.drafts else None
    return Models(loaded.target, draft, loaded.vocab_padding)


def context_models(models: Models) -> list[Any]:
    """The models whose context a prompt must fit: the target's and a draft model's."""
    return [models.target.model] + ([models.draft.model] if models.draft is not None else [])


def nan_error(
    s: Settings, examples: Sequence[Example], error: FloatingPointError, members: Sequence[int]
) -> JobError:
    """NaN logits of the target or the draft while decoding the batch of `members`."""
    indices = ", ".join(str(examples[i].index) for i in members)
    paths = {"target": ml.where(s.models.target), "draft": _where(s.draft)}
    return common.nan_error(
        error, f"while decoding input(s) {indices}", "try DTYPE = 'float32'", paths
    )


def _where(spec: Any) -> str:
    """What a NaN error names for the draft: its path, or a DraftSpec's description ("" plain)."""
    if spec is None:
        return ""
    return ml.where(spec) if isinstance(spec, ml.ModelSpec) else ml.describe(spec)


def decode_pending(
    s: Settings,
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
    progress = Progress(s, len(examples), store, writer)
    # Built lazily, one batch ahead of the decoding: tee keeps the batch beside its result.
    pending, to_run = itertools.tee(job_batches(s, ids, todo, decoder))
    runs = runner.run_batches({"decode": decoder}, ((b.batch, b.rng) for b in to_run))
    for job_batch in pending:
        try:
            result = next(runs)
        except FloatingPointError as e:
            raise nan_error(s, examples, e, job_batch.members) from e
        except ValueError as e:
            raise invalid_batch(job_batch.number, e) from e
        out = result.outputs["decode"]
        stats.decode_s += result.seconds["decode"]
        stats.compile_batches += "decode" in result.compile_s
        stats.compile_s += result.compile_s.get("decode", 0.0)
        if s.models.partitioner is not None:  # every host takes part; host 0 gets the rows
            out = distributed.gather_to_host0(out)
        if not writer:  # host 0 writes the rows
            continue
        members = job_batch.members
        rows = output_rows(
            [examples[i] for i in members],
            out,
            vocabulary,
            s.speculative,
            [encoded[i] for i in members],
        )
        rows = [r for r in rows if r["index"] not in store.done]  # a torn batch's survivors stay
        store.append(rows)
        stats.decoded_examples += len(rows)
        stats.decoded_tokens += sum(r["length"] for r in rows)
        progress.update(rows, stats)
    progress.close()
    return stats


class Progress:
    """The progress bar (the writer's, with PROGRESS): tokens/s and the running pooled alpha."""

    def __init__(self, s: Settings, total: int, store: ResultStore, writer: bool):
        self.speculative = s.speculative
        spec_rows = [r for r in store.rows() if "alpha" in r]
        self.pooled = pool_rows(spec_rows) if spec_rows else None
        self.bar = tqdm(
            total=total,
            initial=len(store.done),
            unit="ex",
            disable=not (s.run.progress and writer),
            file=sys.stderr,
        )

    def update(self, rows: Sequence[Mapping[str, Any]], stats: RunStats) -> None:
        postfix = {"tok/s": f"{stats.tokens_per_s:.1f}" if stats.decode_s else "compiling"}
        if self.speculative and rows:
            self.pooled = pool_rows(([self.pooled] if self.pooled else []) + list(rows))
            postfix["alpha"] = f"{self.pooled['alpha']:.3f}"
        self.bar.set_postfix(postfix)
        self.bar.update(len(rows))

    def close(self) -> None:
        self.bar.close()


def measure_cost(
    s: Settings, models: Models, config: decoding.DecodeConfig, ids: Sequence[int]
) -> dict[str, Any]:
    """c (draft step / target step) on a batch of the first input, and Thm 3.8's estimates."""
    # Said before it starts: timing compiles and runs both models a while after the bar ends.
    logging.getLogger(__name__).info(
        "measuring c (one draft step / one target step, each timed alone; "
        "speculative.InferConfig.measure_c=False skips it)"
    )
    width = inputs.bucket(len(ids), s.inputs.input_length)
    probe = inputs.make_batch([ids] * s.run.batch_size, models.encoder_decoder, width)
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


def memory_report(
    s: Settings, models: Models, ids: Sequence[Sequence[int]], gamma: int | None
) -> str:
    """`memory.job_report` for the job at `gamma` (None: plain decoding)."""
    draft = common.model_of(models.draft) if models.draft is not None else None
    if s.tree is not None:  # the cache holds a whole tree's block, its nodes + 1
        gamma = s.tree.size
    partitioner = s.models.partitioner
    mesh = None if partitioner is None else partitioner.mesh_shape
    args = (s.run.batch_size, max(len(x) for x in ids), s.inputs.max_decode_len, gamma or 0)
    dtype = common.param_dtype(models.target)
    return memory.job_report(
        models.target.model,
        draft,
        batch_size=args[0],
        input_len=args[1],
        max_decode_len=args[2],
        gamma=args[3],
        param_dtype=dtype,
        mesh_shape=mesh,
        # a draft with its own tokenizer: its params, cache and tables; int8: its params as loaded
        draft_parts=common.cross_draft_parts(models.draft, mesh, *args, dtype)
        or common.int8_draft_parts(models.draft),
    )
