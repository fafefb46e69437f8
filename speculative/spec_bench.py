"""Spec-Bench job: Spec-Bench's questions asked through the target's chat template, every turn of a
question in one conversation, plain and speculative decoding interleaved, scored as Spec-Bench.

    python -m speculative.spec_bench --gin_file=configs/spec_bench/qwen_coder.gin \
        --gin.QUESTIONS="'question.jsonl'" --gin.OUTPUT_DIR="'/tmp/spec_bench'" \
        [--gin.PER_TASK=10] [--gin.PER_MT_BENCH_CATEGORY=2] [--gin.TEMPERATURE=1.0]

Everything is bound in gin (configs/runs/spec_bench.gin lists the macros): the questions file
(Spec-Bench's question.jsonl: question_id, category, turns), which tasks and how many questions
of each, the target and draft, the chat template (the model's own unless CHAT_TEMPLATE is given),
sampling, gamma, the answers' length and OUTPUT_DIR.

Output, in OUTPUT_DIR:
  predictions.jsonl  one row per question once every program has answered all its turns: index,
                     question_id, category, task, and per program ('plain', 'speculative') each
                     turn's prompt_tokens, new_tokens, wall_time, text, tokens and statistics
                     (tau; alpha, acceptance by position for speculative decoding). Fsynced a
                     question at a time; a killed job rerun on the same OUTPUT_DIR asks only the
                     questions with no row, and writes every row once.
  summary.json       Spec-Bench's scores per task and overall (speedup: mean tokens per second
                     over questions against plain decoding's), our end-to-end ratio, tau, alpha,
                     acceptance by position, questions identical to plain; compile and first-run
                     seconds per program and prompt width, apart; provenance and environment.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from speculative.config import gin_flags
from speculative.jobs.spec_bench.config import SpecBenchConfig
from speculative.jobs.spec_bench.run import run


def main(argv: Sequence[str]) -> dict[str, Any] | None:
    return gin_flags.configure_and_run(
        argv, __doc__.split("\n\n")[0], SpecBenchConfig, run, "configs/runs/spec_bench.gin"
    )


if __name__ == "__main__":
    sys.exit(gin_flags.run_job(main))
