"""The Spec-Bench job's order of work: read and select the questions, check every setting and the
chat template (before any weights load), then under OUTPUT_DIR's lock ask each pending question
(plain first, then speculative: interleaved question by question, so that drifting machine load
hits both alike), append its row, and write summary.json with Spec-Bench's scores.

Rows (OUTPUT_DIR/predictions.jsonl, one per question, written once it has every answer, fsynced):
index, question_id, category, task, and per program ('plain', 'speculative') its turns: prompt
and new tokens, wall seconds, the answer's text and ids, the turn's statistics. A killed job
rerun with the same OUTPUT_DIR redoes no finished question and writes every row once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

import gin
import jax

from speculative import vocab
from speculative.data import chat_inputs, spec_bench
from speculative.errors import JobError
from speculative.jobs import common, pairs
from speculative.jobs.spec_bench.config import SpecBenchConfig
from speculative.loading import specs as ml
from speculative.measure import conversation, runner
from speculative.measure import spec_bench as scoring
from speculative.outputs import provenance
from speculative.outputs.job_io import open_result_store
from speculative.vocab import chat

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Prepared:
    """Everything checked before weights load."""

    questions: list[spec_bench.Question]
    vocabulary: Any
    template: chat.ChatTemplate
    stops: tuple[int, ...]
    plain: Any  # DecodeConfig
    speculative: Any  # DecodeConfig
    seed: int


def prepare(cfg: SpecBenchConfig) -> Prepared:
    """Questions, vocabulary, template and decode settings, each refused with one line."""
    chosen = spec_bench.select(
        spec_bench.read_questions(cfg.questions),
        cfg.tasks,
        cfg.per_task,
        cfg.per_mt_bench_category,
    )
    if not chosen:
        raise JobError(f"no question of {list(cfg.tasks)} in {cfg.questions}")
    if cfg.draft is None and not cfg.plain:
        raise JobError("nothing to run: no draft and plain = False")
    if isinstance(cfg.width_multiple, bool) or not isinstance(cfg.width_multiple, int):
        raise JobError(f"width_multiple must be a positive integer, got {cfg.width_multiple!r}")
    if cfg.width_multiple < 1:
        raise JobError(f"width_multiple must be a positive integer, got {cfg.width_multiple!r}")
    target = pairs.model_spec(cfg.target)
    vocabulary = ml.load_vocabulary(cfg.vocabulary or pairs.vocab_spec(target), "vocabulary")
    template = chat_inputs.template_for(vocabulary, cfg.chat_template)
    stops = vocab.stop_ids(vocabulary)
    plain, drafting, _ = pairs.decode_configs(stops, cfg)
    return Prepared(chosen, vocabulary, template, stops, plain, drafting, cfg.seed)


def fingerprint(cfg: SpecBenchConfig, prepared: Prepared) -> dict[str, Any]:
    """What makes two runs the same job (a resume with other settings is refused)."""
    digest = hashlib.sha256(
        json.dumps([[q.question_id, q.category, q.turns] for q in prepared.questions]).encode()
    ).hexdigest()
    settings = {k: repr(v) for k, v in dataclasses.asdict(cfg).items() if k not in ("output_dir",)}
    return {"job": "spec_bench", "questions": digest, "settings": settings}


def shortlist_prompts(prepared: Prepared) -> list[list[int]]:
    """Every user turn, rendered alone: the ids a draft's shortlist head keeps besides its own."""
    return [
        chat.encode_rendered(
            prepared.vocabulary, prepared.template.render([{"role": "user", "content": t}])
        )
        for q in prepared.questions
        for t in q.turns
    ]


def load_programs(cfg: SpecBenchConfig, prepared: Prepared) -> tuple[conversation.Programs, int]:
    """The target (and draft) loaded as the other jobs load them (`pairs.load`), as
    compiled-per-width programs, and the longest sequence every model takes (a conversation must
    fit it)."""
    draft = None if cfg.draft is None else pairs.model_spec(cfg.draft)
    pair = pairs.load(
        pairs.model_spec(cfg.target), draft, cfg.vocabulary, prompts=shortlist_prompts(prepared)
    )
    model, params = pair.target.model, pair.target.params
    programs: dict[str, runner.Program] = {}
    own: dict[str, Any] = {}  # a draft with another tokenizer reads the text in its own tokens
    if cfg.plain:
        programs["plain"] = runner.Decoder(model, params, prepared.plain)
    if pair.draft is not None:
        programs["speculative"] = runner.Decoder(
            model, params, prepared.speculative, pair.draft.model, pair.draft.params
        )
        if pair.draft_vocabulary is not None:
            own["speculative"] = pair.draft_vocabulary
    models = [model] + ([pair.draft.model] if pair.draft is not None else [])
    limits = [m.max_length for m in models if getattr(m, "max_length", None) is not None]
    context = min(limits) if limits else 1 << 30
    return conversation.Programs(programs, cfg.width_multiple, draft_vocabularies=own), context


def ask(
    cfg: SpecBenchConfig,
    prepared: Prepared,
    programs: conversation.Programs,
    context: int,
    index: int,
) -> dict[str, Any]:
    """One question through every program: its row."""
    question = prepared.questions[index]
    row: dict[str, Any] = {
        "index": index,
        "question_id": question.question_id,
        "category": question.category,
        "task": question.task,
        "programs": {},
    }
    for name in programs.programs:

        def decode(ids: Sequence[int], turn: int, text: str, name: str = name) -> tuple[Any, float]:
            key = jax.random.fold_in(jax.random.PRNGKey(prepared.seed), question.question_id)
            return programs.run(name, ids, jax.random.fold_in(key, turn), text)

        row["programs"][name] = answer(cfg, prepared, question, decode, context)
    return row


def answer(
    cfg: SpecBenchConfig,
    prepared: Prepared,
    question: spec_bench.Question,
    decode: Any,
    context: int,
) -> dict[str, Any]:
    """One program's answers to every turn of `question` (`conversation.converse` with `decode`):
    a row's {"turns": [...]}."""
    turns = conversation.converse(
        decode, prepared.template, prepared.vocabulary, question.turns,
        stops=prepared.stops, context=context, max_new_tokens=cfg.max_new_tokens,
        system=cfg.system, where=f"question {question.question_id} ({question.source})",
    )  # fmt: skip
    return {"turns": [t.to_json() for t in turns]}


def run(cfg: SpecBenchConfig) -> dict[str, Any]:
    """Runs (or resumes) the job; returns the summary also written to OUTPUT_DIR/summary.json."""
    prepared = prepare(cfg)
    job = fingerprint(cfg, prepared)
    code = provenance.git_state()  # the code that runs, as it was at the start (a long run's
    # tree may be edited before it ends)
    with common.locked_output_dir(cfg.output_dir, None):
        store = open_result_store(cfg.output_dir, job)
        todo = [i for i in range(len(prepared.questions)) if i not in store.done]
        log.info(
            f"{len(prepared.questions)} questions, {len(store.done)} already in {store.path}, "
            f"{len(todo)} to ask"
        )
        compile_s: dict[str, float] = {}
        warmup_s: dict[str, float] = {}  # each program's first run, untimed
        start = time.perf_counter()
        if todo:
            programs, context = load_programs(cfg, prepared)
            for done, index in enumerate(todo, 1):
                store.append([ask(cfg, prepared, programs, context, index)])
                log.info(f"question {prepared.questions[index].question_id}: {done}/{len(todo)}")
            compile_s = {f"{n}@{w}": s for (n, w), s in programs.compile_s.items()}
            warmup_s = {f"{n}@{w}": s for (n, w), s in programs.warmup_s.items()}
        rows = store.rows()
        summary = {
            "scores": scoring.summarize(rows),
            "this_run": {
                "questions": len(todo),
                "seconds": time.perf_counter() - start,
                "compile_s": compile_s,
                "warmup_s": warmup_s,
            },
            "settings": job["settings"],
            "provenance": {**provenance.record(gin.operative_config_str()), **code},
            "environment": provenance.environment(),
        }
        store.finish()
        store.out.write_text("summary.json", json.dumps(summary, indent=2))
    print(scoring.table(summary["scores"]))
    return summary
