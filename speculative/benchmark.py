"""Benchmark job: plain vs speculative decoding of the same target, prompts and sampling, one run.

    python -m speculative.benchmark --gin_file=configs/runs/benchmark.gin \
        --gin_file=configs/demo/qwen_coder_benchmark.gin --gin.OUTPUT_DIR="'benchmarks/qwen'"

For every batch size B (skipped, and recorded as such, when its estimated memory does not fit or
the run fails for lack of memory) and temperature T (with the configured top-k / top-p):
  - the inputs are cut into ceil(N / B) batches (cycling the N inputs to fill the last one), each
    padded to its own power-of-two width; plain decoding and each gamma compile once per width
    (ahead of time, timed apart);
  - after one warm-up run each, batch j is run by plain decoding and then by every gamma before
    batch j+1 (interleaved, so drifting machine load hits all of them alike), `repeats` times;
    a batch's time is its median; tokens/s is total tokens over the sum of medians. Decoding stops
    at the vocabulary's stop ids (EOS and end-of-text tokens) or the target length. Plain and
    speculative use the same rng per batch;
  - both prefills are timed alone on every batch too: "decode speedup" subtracts them (the
    draft's prefill is charged to speculative decoding) and compares the decode loops alone;
  - c = draft step / target step, both timed single-token steps at batch B; the target's extend
    by gamma+1 tokens (one verify call) is timed too, and "cost model" is Thm 3.8's accounting
    with that measured verify cost in place of one step: tau * step / (gamma * draft + verify);
  - the target's weight bytes over the measured memory read bandwidth give the weight-streaming
    floor of one plain step, printed beside the measured plain time per step.
Speedup = speculative tokens/s / plain tokens/s. Theorem 3.8 predicts it from the measured alpha
(pooled over the gammas of a (B, T) cell) and c; the optimal gamma maximises that prediction.
Writes OUTPUT_DIR/benchmark.json, speedup_vs_gamma.png, speedup_vs_batch.png and
acceptance_by_position.png.

VARIANTS (BenchmarkConfig.variants, `speculative.Variant`): several drafts / acceptance rules /
gamma policies, each at its own gammas and temperatures, all interleaved against the cell's one
plain baseline (configs/demo/qwen_coder_drafts.gin); points name their variant, and with
SCORE_OUTPUTS carry the target's mean log-probability per generated token of their outputs.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import sys
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Any

import gin
import jax
import jax.numpy as jnp
import numpy as np

from speculative import benchmark_report, decoding, gin_flags, inputs, job_spmd, metrics, vocab
from speculative import model_loading as ml
from speculative.decoding.drafter import Drafter
from speculative.errors import JobError
from speculative.job_config import BenchmarkConfig, Variant, check_lenience, check_num_examples
from speculative.job_io import lock_output_dir
from speculative.measure import memory, runner, timing
from speculative.sampling import SamplingConfig

# ------------------------------------------------------------------------------------------------
# Configuration, inputs, models.


def validate(cfg: BenchmarkConfig) -> None:
    """Raises JobError for a config the job cannot run (before any weight or input is read)."""
    for name in ("target", "vocabulary", "output_dir"):
        if getattr(cfg, name) is gin.REQUIRED:
            raise JobError(f"speculative.BenchmarkConfig.{name} is required")
    ml.validate_model_spec(cfg.target, "target")
    if cfg.variants is None or any(v.draft is None for v in cfg.variants):
        if cfg.draft is gin.REQUIRED:
            raise JobError("speculative.BenchmarkConfig.draft is required")
        ml.validate_model_spec(cfg.draft, "draft")
    ml.validate_vocab_spec(cfg.vocabulary, "vocabulary")
    check_lenience(cfg.lenience)
    for name in ("gammas", "batch_sizes"):
        values = list(getattr(cfg, name))
        if not values or any(not isinstance(v, int) or v < 1 for v in values):
            raise JobError(f"{name} must be a non-empty list of integers >= 1, got {values}")
    if not list(cfg.temperatures) or any(t < 0 for t in cfg.temperatures):
        raise JobError(
            f"temperatures must be a non-empty list of values >= 0, got {cfg.temperatures}"
        )
    if not isinstance(cfg.repeats, int) or cfg.repeats < 1:
        raise JobError(f"repeats must be an integer >= 1, got {cfg.repeats!r}")
    check_num_examples(cfg.num_examples)
    if cfg.variants is not None:
        validate_variants(cfg)


def validate_variants(cfg: BenchmarkConfig) -> None:
    """Raises a one-line JobError naming the first bad entry of cfg.variants."""
    if isinstance(cfg.variants, (str, Variant)) or not list(cfg.variants):
        raise JobError(f"variants must be None or a non-empty list of Variants, got {cfg.variants}")
    names, temperatures = set(), {float(t) for t in cfg.temperatures}
    for v in cfg.variants:
        if not isinstance(v, Variant):
            raise JobError(f"variants: expected speculative.Variant, got {type(v).__name__}")
        if not isinstance(v.name, str) or not v.name:
            raise JobError(f"variants: every variant needs a non-empty name, got {v.name!r}")
        if v.name in names:
            raise JobError(f"variant {v.name!r}: duplicate name")
        names.add(v.name)
        if v.draft is not None:
            ml.validate_model_spec(v.draft, f"variant {v.name!r} draft")
        try:
            check_lenience(v.lenience)
        except JobError as e:
            raise JobError(f"variant {v.name!r}: {e}") from None
        if not isinstance(v.gamma_policy, decoding.GammaPolicy):
            raise JobError(f"variant {v.name!r}: gamma_policy must be a decoding.GammaPolicy")
        gammas = list(v.gammas) if v.gammas is not None else [1]
        if not gammas or any(
            isinstance(g, bool) or not isinstance(g, int) or g < 1 for g in gammas
        ):
            raise JobError(
                f"variant {v.name!r}: gammas must be a non-empty list of integers >= 1, "
                f"got {list(v.gammas)}"
            )
        temps = list(v.temperatures) if v.temperatures is not None else list(cfg.temperatures)
        outside = [t for t in temps if float(t) not in temperatures]
        if temps and len(outside) == len(temps):  # TEMPERATURES narrowed to split a sweep
            print(f"variant {v.name!r} skipped: it runs at {temps}, none of TEMPERATURES")
        elif not temps or outside:
            raise JobError(
                f"variant {v.name!r}: temperatures {temps} must be a non-empty subset of "
                f"TEMPERATURES {list(cfg.temperatures)}"
            )
    for t in cfg.temperatures:  # a cell needs something to compare with its plain baseline
        if not any(v.temperatures is None or t in v.temperatures for v in cfg.variants):
            raise JobError(f"no variant runs at temperature {t}; drop it from TEMPERATURES")


def variants_of(cfg: BenchmarkConfig) -> list[Variant]:
    """cfg.variants with their defaults filled in (draft, gammas, temperatures), less those that
    run at none of cfg.temperatures; without variants, the one variant "default": cfg.draft at
    cfg.gammas with cfg.lenience."""
    if cfg.variants is None:
        return [Variant("default", cfg.draft, float(cfg.lenience), gammas=tuple(cfg.gammas))]
    filled = [
        dataclasses.replace(
            v,
            draft=cfg.draft if v.draft is None else v.draft,
            gammas=tuple(cfg.gammas if v.gammas is None else v.gammas),
            temperatures=None if v.temperatures is None else tuple(map(float, v.temperatures)),
        )
        for v in cfg.variants
    ]
    return [v for v in filled if any(runs_at(v, t) for t in cfg.temperatures)]


def all_gammas(cfg: BenchmarkConfig) -> list[int]:
    """Every gamma any variant runs, sorted (what caches and verify costs are sized for)."""
    return sorted({g for v in variants_of(cfg) for g in v.gammas})


def runs_at(variant: Variant, temperature: float) -> bool:
    return variant.temperatures is None or float(temperature) in variant.temperatures


def distinct_drafts(variants: Sequence[Variant]) -> list[Any]:
    """The variants' draft specs without repeats (equal specs share one loaded draft)."""
    specs: list[Any] = []
    for v in variants:
        if v.draft not in specs:
            specs.append(v.draft)
    return specs


@dataclasses.dataclass(frozen=True)
class Setup:
    """The loaded models and tokenized inputs every cell of the sweep shares.

    ids: token ids per input; width: the bucket of the longest (what memory is planned for).
    truncated: inputs cut to the inputs feature length; vocab_padding: the padding ids masked out
    of both models ({} when none, see `model_loading.fit_vocabulary`).
    """

    target: ml.Loaded
    draft: ml.Loaded
    stop_ids: tuple[int, ...]
    num_examples: int
    ids: list[list[int]]
    width: int
    truncated: int = 0
    vocab_padding: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Every distinct draft (the variants' specs in order; drafts[0] is `draft`) and, per variant
    # name, the index of its draft. Empty: `draft` alone, for every variant.
    drafts: Sequence[ml.Loaded] = ()
    draft_of: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @property
    def encoder_decoder(self) -> bool:
        return self.target.model.is_encoder_decoder

    @property
    def draft_model(self) -> Any:
        """The draft as a model, or None for a `Drafter` that is not a separate model (no
        prefill, weights or cache of its own to account for)."""
        return model_of(self.draft)

    def all_drafts(self) -> list[ml.Loaded]:
        return list(self.drafts) or [self.draft]

    def draft_index(self, variant: str) -> int:
        return self.draft_of.get(variant, 0)


def model_of(draft: ml.Loaded) -> Any:
    """A loaded draft's model, or None for a `Drafter` (no prefill, weights or cache of its own)."""
    return None if isinstance(draft.model, Drafter) else draft.model


def load(cfg: BenchmarkConfig) -> Setup:
    examples = inputs.read_examples(
        cfg.input_file, input_field=cfg.input_field, limit=cfg.num_examples
    )
    vocabulary = ml.load_vocabulary(cfg.vocabulary, "vocabulary")
    variants = variants_of(cfg)
    draft_specs = distinct_drafts(variants)
    roles = [_draft_role(cfg, i) for i in range(len(draft_specs))]
    specs = [("target", cfg.target)]
    specs += [(r, s) for r, s in zip(roles, draft_specs) if not isinstance(s, ml.DraftSpec)]
    mesh = {} if cfg.partitioner is None else {"partitioner": cfg.partitioner}
    loaded = {role: (ml.load_model(spec, role, **mesh), ml.where(spec)) for role, spec in specs}
    ml.check_draft_vocabulary(cfg.draft_vocabulary, vocabulary)
    fitted, padding = ml.fit_vocabulary(vocabulary, ml.where(cfg.vocabulary), loaded)
    for role, spec in zip(roles, draft_specs):
        if isinstance(spec, ml.DraftSpec):  # built for the fitted target's width
            fitted[role] = ml.build_draft(spec, fitted["target"], role)
    target = fitted["target"]
    cap = cfg.feature_lengths["inputs"]
    encoded = inputs.encode(examples, vocabulary, target.model.is_encoder_decoder, cap)
    truncated = sum(e.truncated for e in encoded)
    if truncated:
        print(f"{truncated} input(s) longer than {cap} tokens are truncated to their last {cap}")
    ids = [e.ids for e in encoded]
    drafts = [
        ml.with_shortlist(fitted[role], spec, vocabulary, ids, role)
        for role, spec in zip(roles, draft_specs)
    ]
    width = inputs.bucket(max(len(x) for x in ids), cap)
    stop_ids = vocab.stop_ids(vocabulary)
    draft_of = {v.name: draft_specs.index(v.draft) for v in variants}
    return Setup(
        target, drafts[0], stop_ids, len(examples), ids, width, truncated, padding, drafts, draft_of
    )


def _draft_role(cfg: BenchmarkConfig, index: int) -> str:
    """How errors name the index-th distinct draft: "draft" alone without variants."""
    return "draft" if cfg.variants is None else f"draft {index + 1}"


def batches_of(setup: Setup, cfg: BenchmarkConfig, batch_size: int) -> list[dict[str, jax.Array]]:
    """ceil(N / B) batches cycling the N inputs, each padded to its own bucket (as the infer job
    does): padding every prompt to the longest would bill short prompts for a long prefill."""
    batches = []
    for rows in inputs.cycled_rows(len(setup.ids), batch_size):
        ids = [setup.ids[i] for i in rows]
        width = inputs.bucket(max(len(x) for x in ids), cfg.feature_lengths["inputs"])
        batches.append(inputs.make_batch(ids, setup.encoder_decoder, width))
    return batches


def available_bytes() -> int:
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def memory_shortfall(setup: Setup, cfg: BenchmarkConfig, batch_size: int) -> str | None:
    """Why `batch_size` cannot fit in this host's free memory, or None when it may.

    The weights are loaded already, so what must still fit is the decode state of both models and
    XLA's workspace at the largest gamma, as `speculative.memory` estimates them; the check skips
    batch sizes that clearly cannot fit, no more.
    """
    available = available_bytes()
    need, usable = 0, 0
    for draft in setup.all_drafts():  # one program runs at a time: the largest draft counts
        plan = memory.plan(
            setup.target.model,
            model_of(draft) or setup.target.model,
            memory.Device("this host", available, 1),
            batch_size=batch_size,
            input_len=setup.width,
            max_decode_len=cfg.feature_lengths["targets"],
            gamma=max(all_gammas(cfg)),
            param_dtype=_param_dtype(setup.target),
            mesh_shape={"data": 1, "model": 1},
            usable_fraction=0.8,
        )
        draft_cache = plan.draft_cache if model_of(draft) is not None else 0
        need = max(need, plan.target_cache + draft_cache + plan.workspace)
        usable = plan.usable
    if need <= usable:
        return None
    return f"estimated {need / 2**30:.1f} GiB > 80% of available {available / 2**30:.1f} GiB"


def _param_dtype(loaded: ml.Loaded) -> Any:
    return jax.tree.leaves(loaded.params)[0].dtype


# ------------------------------------------------------------------------------------------------
# Timing: every program on batch j before batch j + 1.


@dataclasses.dataclass
class Timed:
    """One program over all batches: seconds (sum of per-batch medians), batch_seconds, compile_s;
    tokens and outputs only for programs that return a DecodeOutput."""

    seconds: float = 0.0
    batch_seconds: list[float] = dataclasses.field(default_factory=list)
    compile_s: float = 0.0
    tokens: int = 0
    outputs: list[decoding.DecodeOutput] = dataclasses.field(default_factory=list)

    def add(self, output: Any, seconds: float, compile_s: float) -> None:
        self.seconds += seconds
        self.batch_seconds.append(seconds)
        self.compile_s += compile_s
        if isinstance(output, decoding.DecodeOutput):
            self.tokens += int(np.sum(output.lengths))
            self.outputs.append(output)


def interleaved_timings(
    programs: Mapping[Hashable, runner.Program],
    batches: Sequence[dict[str, jax.Array]],
    rngs: Sequence[jax.Array],
    repeats: int,
) -> dict[Hashable, Timed]:
    """Times every program on every batch, all programs on batch j before batch j+1.

    A program is compiled once per batch shape (prompt width), on first use, and warmed up once
    (not timed); a batch's time is the median of `repeats` runs. Interleaving puts the plain
    baseline and each gamma under the same machine conditions (a drift in load or clock affects
    all of them alike).
    """
    timed = {name: Timed() for name in programs}
    runs = runner.run_batches(programs, zip(batches, rngs), repeats=repeats, warmup=True)
    for j, (batch, result) in enumerate(zip(batches, runs)):
        for name in programs:
            timed[name].add(
                result.outputs[name], result.seconds[name], result.compile_s.get(name, 0.0)
            )
        shape = tuple(inputs.input_tokens(batch).shape)
        seconds = ", ".join(f"{_label(n)} {result.seconds[n]:.1f}s" for n in programs)
        print(f"    batch {j + 1}/{len(batches)} {shape}: {seconds}", flush=True)
    return timed


def _label(name: Hashable) -> str:
    """A program's name in progress lines: "plain", "draft prefill", "gamma 3", "bigram gamma 2"."""
    if isinstance(name, str):
        return name
    variant, gamma = name
    return f"gamma {gamma}" if variant == "default" else f"{variant} gamma {gamma}"


# ------------------------------------------------------------------------------------------------
# One cell: a batch size and a sampling setting, every gamma against one plain baseline.


@dataclasses.dataclass(frozen=True)
class Point:
    """One gamma of a cell against the cell's plain baseline (benchmark.json's points).

    *_s: seconds summed over the batches; *_batch_s: per batch (median of the repeats).
    decode_speedup: both prefills subtracted (the draft's too), the decode loops alone, as Thm 3.8
    models them. cost_model_speedup: Thm 3.8 with the measured verify cost.
    round_s: measured seconds per speculative round (decode time without the prefills / rounds,
    a batch's rounds being its slowest row's target calls); round_parts_s: what its parts cost
    alone, gamma draft steps + one verify call + the round's sampling work.
    greedy_identical_to_plain: None unless greedy and exact.
    variant / draft / lenience / exact / gamma_policy: the speculative setting (`Variant`);
    c / draft_step_s: its draft's. target_mean_logprob: the target's mean log-probability per
    generated token of these outputs (None unless BenchmarkConfig.score_outputs).
    """

    gamma: int
    alpha: float
    tau: float
    acceptance_by_position: list[float]
    plain_tokens: int
    plain_s: float
    plain_batch_s: list[float]
    plain_tok_s: float
    plain_compile_s: float
    target_prefill_s: float
    draft_prefill_s: float
    speculative_tokens: int
    speculative_s: float
    speculative_batch_s: list[float]
    speculative_tok_s: float
    speculative_compile_s: float
    speedup: float
    decode_speedup: float
    predicted_speedup: float
    cost_model_speedup: float
    round_s: float
    round_parts_s: float
    greedy_identical_to_plain: bool | None
    variant: str = "default"
    draft: str = ""
    lenience: float = 1.0
    exact: bool = True
    gamma_policy: dict[str, Any] = dataclasses.field(default_factory=dict)
    c: float = float("nan")
    draft_step_s: float = float("nan")
    target_mean_logprob: float | None = None


def make_point(
    gamma: int,
    plain: Timed,
    spec: Timed,
    prefill_s: tuple[float, float],
    costs: Mapping[str, Any],
    greedy: bool,
    variant: Variant | None = None,
    draft: str = "",
    logprob: float | None = None,
) -> Point:
    """A gamma's point from its timings, the plain baseline's and the (target, draft) prefills'.

    costs: the cell's, with c / draft_step_s of this variant's draft; variant None: "default"."""
    variant = variant or Variant("default")
    target_prefill_s, draft_prefill_s = prefill_s
    stats = metrics.concat_rows([o.stats for o in spec.outputs])
    lengths = np.concatenate([np.asarray(o.lengths) for o in spec.outputs])
    summary = metrics.summarize(stats, lengths)
    plain_tok_s, spec_tok_s = plain.tokens / plain.seconds, spec.tokens / spec.seconds
    plain_decode_s = plain.seconds - target_prefill_s
    spec_decode_s = spec.seconds - target_prefill_s - draft_prefill_s
    rounds = sum(int(np.max(np.asarray(o.stats.target_calls))) for o in spec.outputs)
    same = None
    if greedy and variant.lenience == 1.0:  # a lossy rule may change greedy tokens
        same = all(
            np.array_equal(np.asarray(p.tokens), np.asarray(s.tokens))
            for p, s in zip(plain.outputs, spec.outputs)
        )
    return Point(
        gamma=gamma,
        alpha=summary["alpha"],
        tau=summary["tau"],
        acceptance_by_position=summary["acceptance_by_position"],
        plain_tokens=plain.tokens,
        plain_s=plain.seconds,
        plain_batch_s=plain.batch_seconds,
        plain_tok_s=plain_tok_s,
        plain_compile_s=plain.compile_s,
        target_prefill_s=target_prefill_s,
        draft_prefill_s=draft_prefill_s,
        speculative_tokens=spec.tokens,
        speculative_s=spec.seconds,
        speculative_batch_s=spec.batch_seconds,
        speculative_tok_s=spec_tok_s,
        speculative_compile_s=spec.compile_s,
        speedup=spec_tok_s / plain_tok_s,
        decode_speedup=(plain_decode_s / plain.tokens) / (spec_decode_s / spec.tokens),
        predicted_speedup=metrics.predicted_speedup(summary["alpha"], gamma, costs["c"]),
        cost_model_speedup=metrics.cost_model_speedup(
            summary["tau"],
            gamma,
            costs["target_step_s"],
            costs["draft_step_s"],
            costs["target_extend_s"][gamma + 1],
        ),
        round_s=spec_decode_s / max(rounds, 1),
        round_parts_s=gamma * costs["draft_step_s"]
        + costs["target_extend_s"][gamma + 1]
        + costs.get("sampling_round_s", {}).get(gamma, 0.0),
        greedy_identical_to_plain=same,
        variant=variant.name,
        draft=draft,
        lenience=float(variant.lenience),
        exact=float(variant.lenience) == 1.0,
        gamma_policy=dataclasses.asdict(variant.gamma_policy),
        c=costs["c"],
        draft_step_s=costs["draft_step_s"],
        target_mean_logprob=logprob,
    )


def cell_programs(
    setup: Setup, cfg: BenchmarkConfig, sampling: SamplingConfig
) -> dict[Hashable, runner.Program]:
    """The prefills (the target's, each draft model's), plain decoding and every variant of the
    cell at each of its gammas (keys (variant name, gamma))."""
    target, drafts = setup.target, setup.all_drafts()
    plain = decoding.DecodeConfig(cfg.feature_lengths["targets"], setup.stop_ids, sampling)
    programs: dict[Hashable, runner.Program] = {
        "target prefill": runner.Prefill(target.model, target.params, plain),
        "plain": runner.Decoder(target.model, target.params, plain, partitioner=cfg.partitioner),
    }
    variants = [v for v in variants_of(cfg) if runs_at(v, sampling.temperature)]
    for i in sorted({setup.draft_index(v.name) for v in variants}):
        if model_of(drafts[i]) is not None:
            programs[_prefill_key(i)] = runner.Prefill(drafts[i].model, drafts[i].params, plain)
    for v in variants:
        draft = drafts[setup.draft_index(v.name)]
        for gamma in v.gammas:
            config = dataclasses.replace(
                plain, gamma=gamma, lenience=float(v.lenience), gamma_policy=v.gamma_policy
            )
            programs[(v.name, gamma)] = runner.Decoder(
                target.model, target.params, config, draft.model, draft.params, cfg.partitioner
            )
    return programs


def _prefill_key(draft_index: int) -> str:
    return "draft prefill" if draft_index == 0 else f"draft {draft_index + 1} prefill"


def time_cell(
    setup: Setup,
    batches: Sequence[dict[str, jax.Array]],
    cfg: BenchmarkConfig,
    sampling: SamplingConfig,
) -> dict[Hashable, Timed]:
    """Every program of a cell (`cell_programs`) timed on every batch.

    Each program is compiled once per prompt width (ahead of time, timed apart) and rerun on every
    batch of that width; batch j uses the same rng for plain and speculative decoding. The
    prefills are timed alone too, so that decode-only speedups can be reported beside end-to-end.
    """
    rngs = [jax.random.fold_in(jax.random.PRNGKey(cfg.seed), j) for j in range(len(batches))]
    timed = interleaved_timings(cell_programs(setup, cfg, sampling), batches, rngs, cfg.repeats)
    compile_s = ", ".join(f"{_label(n)} {t.compile_s:.1f}s" for n, t in timed.items())
    print(f"  compile: {compile_s}", flush=True)
    return timed


def output_logprob_sum(
    model: Any, params: Any, batch: dict[str, jax.Array], output: decoding.DecodeOutput
) -> float:
    """The target's log-probability summed over a decode's generated tokens (teacher-forced).

    output.tokens [B, T], output.lengths [B]: tokens past a row's length (padding after its stop)
    are not counted. Untempered: log_softmax of the raw logits, whatever the sampling was.
    """
    return float(_logprob_sum(model, params, batch, output.tokens, output.lengths))


@functools.partial(jax.jit, static_argnums=0)
def _logprob_sum(model, params, batch, tokens, lengths):
    width, steps = inputs.input_tokens(batch).shape[1], tokens.shape[1]
    # prefill leaves `last` (the last prompt token, or T5's start token) unfed at `pos`: feeding
    # it and the outputs but the last gives the logits that predicted each output token.
    state, _, last, _ = decoding.prefill(model, params, batch, model.cache_length(width, steps, 1))
    feed = jnp.concatenate([last[:, None], tokens[:, :-1]], axis=1).astype(jnp.int32)  # [B, T]
    logits, _ = model.extend(params, state, feed)  # [B, T, V]
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(logp, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]
    counted = jnp.arange(steps)[None, :] < lengths[:, None]
    return jnp.sum(jnp.where(counted, picked, 0.0))


def mean_logprob(target: ml.Loaded, batches: Sequence[dict[str, jax.Array]], timed: Timed) -> float:
    """The target's mean log-probability per generated token over a program's outputs."""
    total = sum(
        output_logprob_sum(target.model, target.params, b, o)
        for b, o in zip(batches, timed.outputs)
    )
    return total / max(timed.tokens, 1)


def cell_points(
    timed: Mapping[Hashable, Timed],
    setup: Setup,
    variants: Sequence[Variant],
    costs: Mapping[str, Any],
    greedy: bool,
    logprobs: Mapping[Hashable, float] | None = None,
) -> list[Point]:
    """One point per (variant, gamma) against the cell's plain baseline.

    costs: the cell's, with "draft_costs" (per distinct draft: draft_step_s, c)."""
    logprobs = logprobs or {}
    points = []
    for v in variants:
        i = setup.draft_index(v.name)
        draft_prefill = timed.get(_prefill_key(i))  # none for a draft that is not a model
        prefill_s = (
            timed["target prefill"].seconds,
            draft_prefill.seconds if draft_prefill else 0.0,
        )
        draft_costs = {**costs, **costs["draft_costs"][i]}
        description = setup.all_drafts()[i].description
        for gamma in v.gammas:
            key = (v.name, gamma)
            p = make_point(
                gamma,
                timed["plain"],
                timed[key],
                prefill_s,
                draft_costs,
                greedy,
                v,
                description,
                logprobs.get(key),
            )
            name = "" if v.name == "default" else f"{v.name} "
            print(
                f"  {name}gamma {gamma}: alpha {p.alpha:.3f} tau {p.tau:.2f} speedup "
                f"{p.speedup:.2f}x (decode only {p.decode_speedup:.2f}x, Thm 3.8 "
                f"{p.predicted_speedup:.2f}x), plain {p.plain_tok_s:.2f} tok/s, speculative "
                f"{p.speculative_tok_s:.2f} tok/s"
                + ("" if p.target_mean_logprob is None else f", logp {p.target_mean_logprob:.3f}"),
                flush=True,
            )
            points.append(p)
    return points


def pooled_alpha(points: Sequence[Point]) -> float:
    """alpha over a cell's gammas weighted by tokens (alpha does not depend on gamma)."""
    weights = [p.speculative_tokens for p in points]
    return float(np.average([p.alpha for p in points], weights=weights))


def measure_cell(
    setup: Setup,
    batches: Sequence[dict[str, jax.Array]],
    cfg: BenchmarkConfig,
    temperature: float,
    costs: Mapping[str, Any],
) -> dict[str, Any]:
    """benchmark.json's cell for one batch size and temperature (with the configured filters)."""
    sampling = SamplingConfig(float(temperature), cfg.top_k, cfg.top_p)
    extend_ms = ", ".join(f"{n}: {1e3 * t:.0f}" for n, t in costs["target_extend_s"].items())
    print(
        f"batch {len(inputs.input_tokens(batches[0]))}, {sampling}, c {costs['c']:.3f} (target "
        f"step {1e3 * costs['target_step_s']:.0f} ms, draft step "
        f"{1e3 * costs['draft_step_s']:.0f} ms; target extend by n tokens, ms: {extend_ms}):",
        flush=True,
    )
    timed = time_cell(setup, batches, cfg, sampling)
    variants = [v for v in variants_of(cfg) if runs_at(v, temperature)]
    logprobs = {}
    if cfg.score_outputs:  # untimed: after every program of the cell has run
        logprobs = {
            k: mean_logprob(setup.target, batches, t) for k, t in timed.items() if t.outputs
        }
    points = cell_points(timed, setup, variants, costs, sampling.greedy, logprobs)
    first = [p for p in points if p.variant == variants[0].name]
    alpha = pooled_alpha(first)
    cell_costs = {k: v for k, v in costs.items() if k != "draft_costs"}
    extra: dict[str, Any] = {}
    if cfg.variants is not None:
        extra["variants"] = {
            v.name: variant_summary([p for p in points if p.variant == v.name]) for v in variants
        }
    if cfg.score_outputs:
        extra["plain_target_mean_logprob"] = logprobs["plain"]
    return {
        "batch_size": len(inputs.input_tokens(batches[0])),
        "temperature": float(temperature),
        "exact": all(p.exact for p in points),
        "lenience": float(variants[0].lenience),
        "top_k": cfg.top_k,
        "top_p": cfg.top_p,
        "input_widths": [int(inputs.input_tokens(b).shape[1]) for b in batches],
        **cell_costs,
        # Prefill included, so at batch 1 an upper bound on one plain step.
        "plain_s_per_token": points[0].plain_s / points[0].plain_tokens,
        # alpha, c and the optimal gamma of the first variant (the only one without variants).
        "alpha": alpha,
        "c": first[0].c,
        "draft_step_s": first[0].draft_step_s,
        "optimal_gamma": metrics.optimal_gamma(alpha, first[0].c),
        **extra,
        "points": [dataclasses.asdict(p) for p in points],
    }


def variant_summary(points: Sequence[Point]) -> dict[str, Any]:
    """A variant's pooled alpha, its draft's c and the gamma Thm 3.8 finds best for them."""
    alpha = pooled_alpha(points)
    return {
        "alpha": alpha,
        "c": points[0].c,
        "optimal_gamma": metrics.optimal_gamma(alpha, points[0].c),
    }


# ------------------------------------------------------------------------------------------------
# The job.


def header(cfg: BenchmarkConfig, setup: Setup) -> dict[str, Any]:
    """benchmark.json's fields about the run itself (models, inputs, machine), cells empty."""
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(setup.target.params))
    bandwidth = timing.read_bandwidth()
    print(
        f"target weights {weight_bytes / 1e9:.2f} GB, measured read bandwidth "
        f"{bandwidth / 1e9:.1f} GB/s -> weight-streaming floor "
        f"{1e3 * weight_bytes / bandwidth:.0f} ms per plain step"
    )
    return {
        "target": setup.target.description,
        "draft": setup.draft.description,
        **({"drafts": [d.description for d in setup.all_drafts()]} if cfg.variants else {}),
        "inputs": cfg.input_file,
        "num_examples": setup.num_examples,
        "feature_lengths": dict(cfg.feature_lengths),
        "truncated_inputs": setup.truncated,
        "vocab_padding": dict(setup.vocab_padding),
        "padded_input_width": setup.width,
        "repeats": cfg.repeats,
        "stop_ids": list(setup.stop_ids),
        "target_weight_bytes": weight_bytes,
        "read_bandwidth_bytes_s": bandwidth,
        "stream_floor_s_per_step": weight_bytes / bandwidth,
        "jax": jax.__version__,
        "device": str(jax.devices()[0]),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),  # they can change kernels, hence timings
        **({"partitioner": job_spmd.describe(cfg.partitioner)} if cfg.partitioner else {}),
        "cells": [],
        "skipped": [],
    }


def print_memory(setup: Setup, cfg: BenchmarkConfig) -> None:
    gamma = max(all_gammas(cfg))
    for batch_size in cfg.batch_sizes:
        report = memory.job_report(
            setup.target.model,
            setup.draft_model,  # the first draft's (variants' drafts are alike or smaller)
            batch_size=batch_size,
            input_len=setup.width,
            max_decode_len=cfg.feature_lengths["targets"],
            gamma=gamma,
            param_dtype=_param_dtype(setup.target),
            mesh_shape=None if cfg.partitioner is None else cfg.partitioner.mesh_shape,
        )
        print(f"batch {batch_size}, gamma {gamma}: {report}")


def measure_batch_size(
    setup: Setup, cfg: BenchmarkConfig, batch_size: int
) -> Iterator[dict[str, Any]]:
    """Every temperature's cell at one batch size, one at a time; c and the verify costs are
    measured once for them all."""
    batches = batches_of(setup, cfg, batch_size)
    target, gammas = setup.target, all_gammas(cfg)
    cache_len = target.model.cache_length(
        setup.width, cfg.feature_lengths["targets"], max(gammas) + 1
    )
    draft_config = decoding.DecodeConfig(
        cfg.feature_lengths["targets"], setup.stop_ids, gamma=max(gammas)
    )
    costs: dict[str, Any] = {"draft_costs": []}
    for i, draft in enumerate(setup.all_drafts()):  # the target's costs once, with the first
        measured = timing.measure_c(
            target.model,
            target.params,
            draft.model,
            draft.params,
            batches[0],
            cache_len,
            [g + 1 for g in gammas] if i == 0 else (),
            draft_config=draft_config,
        )
        if i == 0:
            costs.update(measured)
        step = measured["draft_step_s"]
        costs["draft_costs"].append({"draft_step_s": step, "c": step / costs["target_step_s"]})
    if cfg.variants is not None:
        print(
            "draft costs: "
            + ", ".join(
                f"{d.description}: c {dc['c']:.3f}"
                for d, dc in zip(setup.all_drafts(), costs["draft_costs"])
            )
        )
    for temperature in cfg.temperatures:
        sampling = SamplingConfig(float(temperature), cfg.top_k, cfg.top_p)
        rows = inputs.input_tokens(batches[0]).shape[0]
        costs["sampling_round_s"] = {
            g: timing.sampling_round_time(rows, target.model.vocab_size, g, sampling)
            for g in gammas
        }
        yield measure_cell(setup, batches, cfg, temperature, dict(costs))


def run(cfg: BenchmarkConfig) -> dict[str, Any]:
    """Runs the sweep; returns the result also written to OUTPUT_DIR/benchmark.json (rewritten
    after every cell, so a long sweep keeps what it measured)."""
    validate(cfg)
    cfg = dataclasses.replace(cfg, partitioner=job_spmd.make_partitioner(cfg.partitioner))
    for batch_size in cfg.batch_sizes:  # refused before any weight is read
        job_spmd.check_batch(cfg.partitioner, batch_size, "BATCH_SIZES entry")
    cache_dir = job_spmd.cache_dir(cfg.compilation_cache_dir, cfg.output_dir)
    with lock_output_dir(cfg.output_dir) as out, job_spmd.compilation_cache(cache_dir) as cache:
        return run_locked(cfg, out, cache)


def run_locked(
    cfg: BenchmarkConfig, out_dir: pathlib.Path, cache: job_spmd.CacheStats | None = None
) -> dict[str, Any]:
    """`run`'s sweep while it holds OUTPUT_DIR's lock. With the compilation cache on,
    benchmark.json's compilation_cache says whether the compile times are warm (cache hits)."""
    setup = load(cfg)
    print_memory(setup, cfg)
    result = header(cfg, setup)
    if cache is not None and cache.dir:
        result["compilation_cache"] = cache.to_json()
    for batch_size in cfg.batch_sizes:
        reason = memory_shortfall(setup, cfg, batch_size)
        if reason is not None:
            print(f"batch {batch_size}: skipped ({reason})")
            result["skipped"].append({"batch_size": batch_size, "reason": reason})
            continue
        try:
            for cell in measure_batch_size(setup, cfg, batch_size):
                result["cells"].append(cell)
                if "compilation_cache" in result:
                    result["compilation_cache"] = cache.to_json()
                (out_dir / "benchmark.json").write_text(json.dumps(result, indent=2))
        except FloatingPointError as e:  # NaN logits: `runner.Decoder` checks every output
            role = "draft" if getattr(e, "role", "target") == "draft" else "target"
            raise JobError(
                f"NaN logits at batch size {batch_size}: corrupt weights, or a dtype too narrow "
                f"for the model ({e})",
                role=role,
                path=ml.describe(cfg.draft) if role == "draft" else ml.where(cfg.target),
            ) from e
        except Exception as e:  # noqa: BLE001  only out-of-memory is expected; others re-raise
            if "RESOURCE_EXHAUSTED" not in str(e) and not isinstance(e, MemoryError):
                raise
            print(f"batch {batch_size}: skipped (out of memory: {str(e)[:200]})")
            reason = f"out of memory: {str(e)[:500]}"
            result["skipped"].append({"batch_size": batch_size, "reason": reason})
    if not result["cells"]:
        raise JobError("no batch size fitted in memory; nothing was measured")
    (out_dir / "benchmark.json").write_text(json.dumps(result, indent=2))
    benchmark_report.plot(result, out_dir)
    benchmark_report.print_table(result)
    print(f"wrote {out_dir}/benchmark.json and plots")
    return result


def main(argv: Sequence[str]) -> dict[str, Any] | None:
    return gin_flags.configure_and_run(argv, __doc__.split("\n\n")[0], BenchmarkConfig, run)


if __name__ == "__main__":
    sys.exit(gin_flags.run_job(main))
