"""The Spec-Bench job's gin settings (configs/runs/spec_bench.gin lists the macros). Kept apart
from the job's code so that parsing a config imports no job."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import gin

from speculative.data import spec_bench
from speculative.jobs import config as job_config  # registers ModelSpec, VocabSpec, ...


@gin.configurable(module="speculative")
@dataclasses.dataclass(frozen=True)
class SpecBenchConfig(job_config.DecodeSettings):
    """What the Spec-Bench job asks, of which models, and how.

    questions: a Spec-Bench question.jsonl (question_id, category, turns).
    tasks: Spec-Bench tasks ('mt_bench', 'translation', 'summarization', 'qa', 'math_reasoning',
      'rag') or single categories ('writing', ...); per_task: the first n questions by
      question_id of each task but MT-bench; per_mt_bench_category: of each MT-bench category
      (None: all).
    target / draft / vocabulary: as the infer job's (`speculative.ModelSpec`, a draft ModelSpec or
      DraftSpec, `speculative.VocabSpec`; vocabulary None: the target's own).
    chat_template: the template text or a .jinja path; None: the model's own (GGUF
      tokenizer.chat_template, a Hugging Face directory's). system: a system turn first (None:
      whatever the template does without one).
    max_new_tokens: tokens per answer at most; gamma / tree / acceptance / sampling / seed: as
      `Pair.generate` takes them; gamma_policy: a `decoding.GammaPolicy` (None: fixed). plain: plain decoding of the target run too, question by
      question before the speculative one (the baseline of every speedup).
    width_multiple: prompts are padded up to a multiple of this (few compilations).
    """

    output_dir: str = gin.REQUIRED
    questions: str = gin.REQUIRED
    target: Any = gin.REQUIRED
    draft: Any = None
    vocabulary: Any = None
    tasks: Sequence[str] = tuple(spec_bench.TASKS)
    per_task: int | None = None
    per_mt_bench_category: int | None = None
    chat_template: str | None = None
    system: str | None = None
    plain: bool = True
    width_multiple: int = 128
