"""The certificate job's gin settings (configs/runs/certify.gin lists the macros). Kept apart
from the job's code so that parsing a config imports no job."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import gin

from speculative.data import spec_bench
from speculative.jobs import config as job_config  # registers ModelSpec, VocabSpec, ...
from speculative.measure import certificate


@dataclasses.dataclass(frozen=True)
class SamplePlan:
    """How much a certificate samples and how it tests: each prompt `rows_per_prompt` times in a
    batch, `seeds` batches (keys fold_in(PRNGKey(seed), i)); `level` each test's false-alarm rate,
    `max_deviation` the KS deviation the run must see with probability 0.9, `control` plain
    decoding through the same tests too."""

    rows_per_prompt: int = 4
    seeds: int = 4
    level: float = certificate.LEVEL
    max_deviation: float = certificate.MAX_DEVIATION
    control: bool = True


@gin.configurable(module="speculative")
@dataclasses.dataclass(frozen=True)
class CertifyConfig(job_config.DecodeSettings, SamplePlan):
    """What the certificate job samples, of which models, and how it tests.

    prompts: texts to decode; with `chat`, each is a user turn put through the target's chat
      template (chat_template: its text or a .jinja path; None: the model's own), else the text
      as it is. input_file: the first `input_limit` inputs of a JSONL / TSV file or 'humaneval'
      are prompts too (as the infer job reads them). questions: a Spec-Bench question.jsonl
      whose questions' first turns are prompts too (tasks, per_task: which, as the Spec-Bench
      job selects them; MT-bench per_task per category).
    target / draft / vocabulary: as the infer job's. The decode certified: `DecodeSettings`
      (T = 1 and 64 tokens unless set); the sample and the tests: `SamplePlan` (a plan that
      cannot reach the power is refused before anything loads).
    """

    output_dir: str = gin.REQUIRED
    target: Any = gin.REQUIRED
    draft: Any = None
    vocabulary: Any = None
    prompts: Sequence[str] = ()
    chat: bool = True
    chat_template: str | None = None
    input_file: str | None = None
    input_limit: int | None = 8
    questions: str | None = None
    tasks: Sequence[str] = tuple(spec_bench.TASKS)
    per_task: int | None = 1
    max_new_tokens: int = 64  # the decode's settings are `DecodeSettings`'s; these two differ
    temperature: float = 1.0
