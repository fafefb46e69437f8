"""alpha at every position of the target's own outputs, teacher-forced (the paper's Table 3
measure): both models score each output of an infer run in one pass, and beta =
sum_x min(p(x), q(x)) is averaged over every generated token (metrics.position_betas).

    python scripts/teacher_forced_alpha.py --gin_file=configs/repro/ende_t0_small.gin \
        --predictions runs/ende/alpha/t0_small --out runs/ende/alpha_tf/t0_small.json

The gin file names the target, the draft (a T5 of the same vocabulary), the vocabulary and the
temperature; the predictions are any infer run's outputs of that target (speculative outputs
are the target's own, greedy or sampled: the algorithm is exact). Encoder-decoder models only.
A missing or torn predictions.jsonl, or a model that is not a T5, is one line `error: ...` and
exit status 2 (`errors.read_result_jsonl`, `gin_flags.run_job`).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from speculative.config import (
    configurables,  # noqa: F401 (gin names)
    gin_flags,  # noqa: F401 (gin names)
)
from speculative.data import inputs  # noqa: F401 (gin names)
from speculative.errors import JobError, read_result_jsonl
from speculative.jobs import config as job_config  # noqa: F401 (gin names)
from speculative.loading import specs as ml
from speculative.measure import metrics  # noqa: F401 (gin names)
from speculative.vocab import base as vocab_base

BATCH = 64


def read_predictions(predictions: pathlib.Path) -> list[dict]:
    """The infer run's output rows (its predictions.jsonl), through the result-file boundary."""
    path = predictions / "predictions.jsonl"
    rows = read_result_jsonl(path, ("inputs", "output_ids"))
    if not rows:
        raise JobError("has no rows: the infer run decoded nothing", path=path)
    return rows


def alpha_over_outputs(
    cfg: job_config.InferConfig, predictions: pathlib.Path, rows: list[dict]
) -> dict:
    target = ml.load_model(cfg.target, "target")
    draft = ml.load_model(cfg.draft, "draft")
    for role, loaded in (("target", target), ("draft", draft)):
        if not getattr(loaded.model, "is_encoder_decoder", False):
            raise JobError(f"the {role} is not an encoder-decoder T5")
    vocabulary = ml.load_vocabulary(cfg.vocabulary)
    eos = vocab_base.stop_ids(vocabulary)[0]
    limit = cfg.feature_lengths["inputs"]
    temperature = float(cfg.sampling.temperature)
    vocab_size = vocab_base.used_size(vocabulary)  # 4,100: the 124 padding ids are masked

    @jax.jit
    def betas(tp, dp, encoder, decoder, targets):
        t_logits = target.model.forward(tp, encoder, decoder)
        d_logits = draft.model.forward(dp, encoder, decoder)
        beta = metrics.position_betas(t_logits, d_logits, temperature, vocab_size)
        mask = targets != 0
        # The alignment check: the target's own arg-max, teacher-forced, is its greedy output.
        own = jnp.argmax(t_logits[..., :vocab_size], axis=-1) == targets
        return jnp.sum(beta * mask), jnp.sum(mask), jnp.sum(own & mask)

    total, tokens, reproduced = 0.0, 0, 0
    for start in range(0, len(rows), BATCH):
        chunk = rows[start : start + BATCH]
        encoder = inputs.pad_rows(
            [list(vocabulary.encode(r["inputs"]))[: limit - 1] + [eos] for r in chunk]
        )
        outputs = [r["output_ids"] for r in chunk]
        targets = inputs.pad_rows(outputs)
        decoder = np.pad(targets[:, :-1], ((0, 0), (1, 0)))  # decoder start token 0
        s, n, own = betas(target.params, draft.params, encoder, decoder, targets)
        total, tokens, reproduced = total + float(s), tokens + int(n), reproduced + int(own)
    if temperature == 0 and reproduced < 0.99 * tokens:
        # Greedy outputs must be the target's arg-max at (nearly: float near-ties) every
        # position; if not, inputs or positions are misaligned and alpha would be wrong.
        raise JobError(
            f"the target's teacher-forced arg-max reproduces only {reproduced} of {tokens} "
            "greedy output tokens: not this target's greedy outputs",
            path=predictions,
        )
    return {
        "alpha": total / tokens,
        "tokens": tokens,
        "target_argmax_reproduces": reproduced / tokens,
        "examples": len(rows),
        "temperature": temperature,
        "target": ml.describe(cfg.target),
        "draft": ml.describe(cfg.draft),
        "predictions": str(predictions),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """The command: 0, or 2 after one line `error: ...` (--debug: the traceback)."""
    return gin_flags.run_job(_main, argv)


def _main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--gin_file", action="append", required=True, help="a gin file; later files override"
    )
    parser.add_argument("--predictions", type=pathlib.Path, required=True)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--binding", action="append", default=[], help="a gin binding")
    parser.add_argument("--debug", action="store_true", help="a traceback instead of one line")
    args = parser.parse_args(argv)
    rows = read_predictions(args.predictions)  # before the models load: a torn file fails fast
    gin_flags.parse_gin(args.gin_file, ["OUTPUT_DIR = None", *args.binding])
    result = alpha_over_outputs(job_config.InferConfig(), args.predictions, rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"alpha {result['alpha']:.3f} over {result['tokens']} tokens: {args.out}")


if __name__ == "__main__":
    sys.exit(main())
