"""The certificate job's gin settings (configs/runs/certify.gin lists the macros). Kept apart
from the job's code so that parsing a config imports no job."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import gin

from speculative.data import spec_bench
from speculative.jobs import config as job_config  # noqa: F401 - registers ModelSpec, VocabSpec, ...
from speculative.measure import certificate


@gin.configurable(module="speculative")
@dataclasses.dataclass(frozen=True)
class CertifyConfig:
    """What the certificate job samples, of which models, and how it tests.

    prompts: texts to decode; with `chat`, each is a user turn put through the target's chat
      template (chat_template: its text or a .jinja path; None: the model's own), else the text
      as it is. input_file: the first `input_limit` inputs of a JSONL / TSV file or 'humaneval'
      are prompts too (as the infer job reads them). questions: a Spec-Bench question.jsonl whose questions' first turns are prompts
      too (tasks, per_task: which, as the Spec-Bench job selects them; MT-bench one per category).
    rows_per_prompt: copies of each prompt in the batch (each row samples on its own); seeds: how
      many batches, each with its own key (fold_in(PRNGKey(seed), i)).
    target / draft / vocabulary: as the infer job's. max_new_tokens / gamma / gamma_policy / tree /
      acceptance / temperature / top_k / top_p: the decode certified.
    level: each test's false-alarm rate; max_deviation: the KS deviation the run must be able to
      see with probability 0.9 (a run that cannot is refused before anything loads); control:
      plain decoding through the same tests too.
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
    rows_per_prompt: int = 4
    seeds: int = 4
    seed: int = 0
    max_new_tokens: int = 64
    gamma: int | None = None
    gamma_policy: Any = None
    tree: Any = None
    acceptance: str = "token"
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    level: float = certificate.LEVEL
    max_deviation: float = certificate.MAX_DEVIATION
    control: bool = True
