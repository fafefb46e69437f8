"""Certificate job: is speculative decoding exact on these models, with these settings? Samples a
batch of prompts under several seeds speculatively and plainly, scores every emitted token by the
target's own processed distribution (teacher-forced), and tests (`measure.certificate`).

    python -m speculative.certify --gin_file=configs/certify/qwen_coder.gin \
        --gin.OUTPUT_DIR="'/tmp/certificate'" [--gin.TEMPERATURE=0.7 --gin.TOP_P=0.9 --gin.TOP_K=20]

Everything is bound in gin (configs/runs/certify.gin lists the macros): the target and draft,
the prompts (PROMPTS, or QUESTIONS: a Spec-Bench file's first turns, through the chat template),
rows per prompt and seeds (the sample size), the decode (gamma, tree, acceptance, sampling) and
the tests' level and power.

Output: OUTPUT_DIR/certificate.json: status ('pass', 'fail', 'inconclusive'), the reasons, per
program (speculative; plain, the control) the tokens scored, Kolmogorov-Smirnov of the randomized
PIT (statistic, p-value, the deviation it could see, a histogram), the stop-token balance (z,
p-value, the excess it could see) and tokens outside the support; greedy: rows identical to
plain. Also the sampling, the plan, the settings, provenance and environment.
Exit status: 0 pass, 1 fail or inconclusive, 2 a setting or input refused (one line on stderr).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from speculative.config import gin_flags
from speculative.jobs.certify.config import CertifyConfig
from speculative.jobs.certify.run import run


def main(argv: Sequence[str]) -> dict[str, Any] | None:
    return gin_flags.configure_and_run(
        argv, __doc__.split("\n\n")[0], CertifyConfig, run, "configs/runs/certify.gin"
    )


def cli(argv: Sequence[str] | None = None) -> int:
    """The command's exit status: run_job's (2 for a refused setting), else 1 unless it passed."""
    result: dict[str, Any] = {}
    status = gin_flags.run_job(lambda args: result.update(main(args) or {"status": "pass"}), argv)
    return status or (0 if result.get("status") == "pass" else 1)


if __name__ == "__main__":
    sys.exit(cli())
