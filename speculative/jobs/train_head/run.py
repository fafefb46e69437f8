"""The head-training job: config, fingerprint and lock, features, the training loop with
checkpoints that resume, held-out alpha per draft position (module doc of speculative/train_head.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sys
import time
from typing import Any

import gin
import jax
import jax.numpy as jnp
import numpy as np

from speculative import vocab as vocab_lib
from speculative.checkpoints import families, t5x_write
from speculative.drafts import feature_head as head_draft
from speculative.drafts import shortlist
from speculative.errors import JobError, output_location
from speculative.jobs.common import check_required
from speculative.jobs.train_head import data
from speculative.jobs.train_head import train as head_train
from speculative.loading import specs as ml
from speculative.models.feature_head import FeatureHead, FeatureHeadConfig, target_lm_head
from speculative.outputs import provenance, summaries
from speculative.outputs.job_io import (
    check_fingerprint,
    keep_records_up_to,
    lock_output_dir,
    require_local,
    write_text_atomic,
)

log = logging.getLogger(__name__)

FINGERPRINT = "head_job.json"


@gin.configurable(module="speculative")
@dataclasses.dataclass(frozen=True)
class HeadTrainConfig:
    """What `speculative.train_head` does (configs/train/qwen_coder_head.gin).

    target / vocabulary: the target's speculative.ModelSpec and VocabSpec (a DecoderLM).
    corpus_bytes: standard-library text read; window: tokens per training window;
    train_windows / heldout_windows: at most this many windows per side (data.py).
    mlp_dim: the head's MLP width (0: the target's); shortlist: ids the head scores (the most
      frequent in the training windows, stop ids forced in; 0: the whole vocabulary).
    feature_noise, classification_weight: the objective (train.py).
    eval_depth / eval_starts: held-out alpha per draft position, at this many starts per window.
    """

    target: Any = gin.REQUIRED
    vocabulary: Any = gin.REQUIRED
    output_dir: str = gin.REQUIRED
    corpus_bytes: int = 4 << 20
    window: int = 256
    train_windows: int = 128
    heldout_windows: int = 8
    feature_batch: int = 2
    mlp_dim: int = 0
    shortlist: int = 32768
    batch_size: int = 2
    steps: int = 1000
    learning_rate: float = 3e-4
    warmup_steps: int = 50
    feature_noise: float = 0.1
    classification_weight: float = 0.1
    seed: int = 0
    checkpoint_every: int = 200
    eval_depth: int = 5
    eval_starts: int = 16
    progress: bool = True

    def fingerprint(self) -> dict[str, Any]:
        """What the checkpoints are a function of (not steps: a run may be extended)."""
        skip = {"output_dir", "steps", "checkpoint_every", "progress", "eval_starts"}
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return json.loads(
            json.dumps({k: v for k, v in fields.items() if k not in skip}, default=repr)
        )


def check(cfg: HeadTrainConfig) -> None:
    """One-line JobErrors for settings that cannot run, before anything is loaded."""
    check_required(cfg, ("target", "vocabulary", "output_dir"))
    require_local(output_location(cfg.output_dir), "the head trainer")
    positive = ("window", "train_windows", "heldout_windows", "feature_batch", "batch_size")
    positive += ("steps", "checkpoint_every", "eval_depth", "eval_starts")
    for name in positive:
        value = getattr(cfg, name)
        if not isinstance(value, int) or value < 1:
            raise JobError(f"HeadTrainConfig.{name} must be an integer >= 1, got {value!r}")
    if cfg.window < 4 * cfg.eval_depth:
        raise JobError(f"HeadTrainConfig.window {cfg.window} is too short for eval_depth")
    if cfg.mlp_dim < 0 or cfg.shortlist < 0 or cfg.feature_noise < 0:
        raise JobError("HeadTrainConfig.mlp_dim, shortlist and feature_noise must be >= 0")


def _progress(cfg: HeadTrainConfig, total: int, initial: int, desc: str):
    if not cfg.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, file=sys.stderr)


def _features(cfg, out, target, vocabulary) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{side: (tokens, features)}, computing what an earlier run left undone."""
    limits = {"train": cfg.train_windows, "heldout": cfg.heldout_windows}
    windows = data.corpus_windows(vocabulary, cfg.corpus_bytes, cfg.window, limits)
    compute = data.target_feature_fn(target.model)
    width = target.model.config.emb_dim
    result = {}
    for side, tokens in windows.items():
        bar = _progress(cfg, len(tokens), 0, f"target features ({side})")
        update = None if bar is None else bar.update
        result[side] = data.extract_features(
            out / "features", side, tokens,
            lambda t: compute(target.params, t), width, cfg.feature_batch, update,
        )  # fmt: skip
        if bar is not None:
            bar.close()
    return result


def _head_ids(cfg, vocabulary, train_tokens: np.ndarray, used: int) -> np.ndarray:
    if not cfg.shortlist:
        return np.arange(used, dtype=np.int32)
    size = min(cfg.shortlist, used)
    return shortlist.most_frequent(train_tokens, size, used, vocab_lib.stop_ids(vocabulary))


def _restore(out, head, ids, optimizer, params):
    """(start step, params, optimizer state) from the newest checkpoint, or fresh."""
    opt_state = optimizer.init(params)
    steps = t5x_write.checkpoint_steps(out)
    if not steps:
        return 0, params, opt_state
    _, params, stored_ids, step = head_draft.load_head(out)
    if not np.array_equal(stored_ids, ids):
        raise JobError(f"{out}: the checkpoints score other ids than this run's shortlist")
    start, opt_state = t5x_write.load_train_state(out / f"checkpoint_{step}", opt_state)
    log.info(f"resuming from {out / f'checkpoint_{step}'} (step {start})")
    return start, params, opt_state


def run(cfg: HeadTrainConfig) -> dict[str, Any]:
    """Trains (or resumes) the head; returns summary.json's contents."""
    check(cfg)
    with lock_output_dir(output_location(cfg.output_dir)) as out:
        check_fingerprint(out, cfg.fingerprint(), name=FINGERPRINT, what="a head")
        slot = "speculative.HeadTrainConfig."  # a spec bound to the wrong slot names it
        vocabulary = ml.load_vocabulary(cfg.vocabulary, slot=slot + "vocabulary")
        target = ml.load_model(cfg.target, "target", slot=slot + "target")
        if not families.supports(target.model, "feature_head"):
            raise JobError(f"a feature head needs a DecoderLM target, got {target.model!r}")
        if target.model.config.rope_scaling:  # the head's own layer computes plain RoPE only
            raise JobError(
                "a feature head uses plain RoPE; a target with RoPE scaling "
                f"{dict(target.model.config.rope_scaling).get('rope_type')!r} is not supported",
                role="target",
                path=ml.where(cfg.target),
            )
        started = time.perf_counter()
        sides = _features(cfg, out, target, vocabulary)
        feature_s = time.perf_counter() - started
        used = vocab_lib.used_size(vocabulary)
        ids = _head_ids(cfg, vocabulary, sides["train"][0], used)
        config = FeatureHeadConfig.for_target(target.model.config, cfg.mlp_dim or None)
        head_draft.save_head_config(out, config)
        return _train(cfg, out, target, config, ids, sides, used, feature_s)


def _train(cfg, out, target, config, ids, sides, used, feature_s) -> dict[str, Any]:
    head = FeatureHead(config)
    lm_head = target_lm_head(target.model.config, target.params)
    table = jnp.asarray(lm_head["kernel"])
    scorer = table[jnp.asarray(ids)]
    embedding = target.params["token_embedder"]["embedding"]
    optimizer = head_train.make_optimizer(cfg.learning_rate, cfg.warmup_steps, cfg.steps)
    params = head.init_params(jax.random.PRNGKey(cfg.seed))
    start, params, opt_state = _restore(out, head, ids, optimizer, params)
    keep_records_up_to(out / "metrics.jsonl", start)
    step_fn = head_train.make_train_step(head, optimizer, cfg)
    drafter, draft_params = head_draft.build_drafter(
        target.model, target.params, config, params, ids
    )
    evaluate = head_train.make_evaluate(drafter, cfg.eval_depth, used)
    tokens, features = sides["train"]
    timer, began, record = summaries.StepTimer(start), time.perf_counter(), {}
    bar = _progress(cfg, cfg.steps, start, "train head")
    # `with`: a raised JobError (a non-finite loss) closes them too, so no writer thread outlives it
    with (
        open(out / "metrics.jsonl", "a", encoding="utf-8") as log,
        summaries.Scalars(out, purge_step=start + 1) as tensorboard,
        bar if bar is not None else contextlib.nullcontext(),
    ):
        for step in range(start, cfg.steps):
            rows = head_train.batch_windows(len(tokens), cfg.batch_size, cfg.seed, step)
            batch = jnp.asarray(np.asarray(features[np.sort(rows)], np.float32))
            rng = jax.random.fold_in(jax.random.PRNGKey(cfg.seed), step)
            params, opt_state, loss, parts = step_fn(
                params, opt_state, batch, jnp.asarray(tokens[np.sort(rows)]), embedding, scorer, rng
            )
            done = step + 1
            if done % 10 == 0 or done == cfg.steps:
                record = {"step": done, "loss": float(loss)}
                record.update({k: float(v) for k, v in parts.items()})
                if not np.isfinite(record["loss"]):
                    raise JobError(f"the head's loss is {record['loss']} at step {done}")
            if done % cfg.checkpoint_every == 0 or done == cfg.steps:
                if not np.isfinite(float(loss)):  # checked here too: never save a poisoned head
                    raise JobError(
                        f"the head's loss is {float(loss)} at step {done}; nothing saved"
                    )
                draft_params = {**draft_params, "head": params}
                held = (*sides["heldout"], cfg.eval_starts, cfg.eval_depth)
                heldout = head_train.evaluate_heldout(evaluate, draft_params, table, *held)
                record = {"step": done, **record, "heldout": heldout}
                t5x_write.save_t5x(out, {"head": params, "lm_head_ids": ids}, done, opt_state)
            if record:
                record["train_s"] = round(time.perf_counter() - began, 1)
                log.write(json.dumps(record) + "\n")
                log.flush()
                tensorboard.write(done, _scalars(cfg, record, timer.per_step(done)))
                record = {}
            if bar is not None:
                bar.update(1)
    return _summary(cfg, out, sides, ids, feature_s)


def _scalars(cfg: HeadTrainConfig, record: dict[str, Any], step_s: float) -> dict[str, Any]:
    """TensorBoard's scalars of a metrics.jsonl record: train/ loss terms, learning rate of its
    last step and seconds per step since the last record; heldout/alpha/<depth> when it has them."""
    schedule = head_train.learning_rate_schedule(cfg.learning_rate, cfg.warmup_steps, cfg.steps)
    scalars = {f"train/{k}": record.get(k) for k in ("loss", "regression", "classification")}
    scalars["train/learning_rate"] = float(schedule(record["step"] - 1))
    scalars["train/step_time_s"] = step_s
    alpha = record.get("heldout", {}).get("alpha", [])
    scalars.update({f"heldout/alpha/{depth}": a for depth, a in enumerate(alpha, 1)})
    return scalars


def _summary(cfg, out, sides, ids, feature_s) -> dict[str, Any]:
    history = [json.loads(line) for line in open(out / "metrics.jsonl", encoding="utf-8")]
    evals = [h for h in history if "heldout" in h]
    summary = {
        "steps": cfg.steps,
        "train_tokens": int(sides["train"][0].size),
        "heldout_tokens": int(sides["heldout"][0].size),
        "head_ids": len(ids),
        "feature_s_this_run": round(feature_s, 1),
        "final": evals[-1] if evals else None,
        "provenance": provenance.record(gin.operative_config_str()),
    }
    write_text_atomic(out / "summary.json", json.dumps(summary, indent=1))
    log.info(f"final held-out evaluation: {json.dumps(summary['final'])}")
    return summary
