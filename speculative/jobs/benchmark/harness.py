"""The benchmark's timing harness: the programs of a cell (the prefills, plain decoding, every
variant at each gamma), each timed on every batch with all programs on batch j before batch j + 1,
and the step costs of a batch size (the target's once, each distinct draft's)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from speculative import decoding
from speculative.data import inputs
from speculative.decoding.sampling import SamplingConfig
from speculative.drafts import staged
from speculative.errors import JobError
from speculative.jobs.benchmark.settings import Settings, round_key
from speculative.jobs.benchmark.setup import Setup
from speculative.loading.specs import Loaded
from speculative.measure import runner, timing

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Timed:
    """One program over all batches: seconds (sum of per-batch medians), batch_seconds (the
    medians), batch_repeat_seconds [batches][repeats] (every timed run), compile_s; tokens,
    batch_tokens [batches], rows (examples decoded) and outputs only for programs that return a
    DecodeOutput."""

    seconds: float = 0.0
    batch_seconds: list[float] = dataclasses.field(default_factory=list)
    batch_repeat_seconds: list[list[float]] = dataclasses.field(default_factory=list)
    compile_s: float = 0.0
    tokens: int = 0
    batch_tokens: list[int] = dataclasses.field(default_factory=list)
    rows: int = 0
    outputs: list[decoding.DecodeOutput] = dataclasses.field(default_factory=list)

    def add(
        self, output: Any, seconds: float, compile_s: float, repeats: list[float] | None = None
    ) -> None:
        """One batch: its output, median seconds, compile seconds and every repeat's seconds
        (None: the median alone)."""
        self.seconds += seconds
        self.batch_seconds.append(seconds)
        self.batch_repeat_seconds.append(list(repeats) if repeats is not None else [seconds])
        self.compile_s += compile_s
        if isinstance(output, decoding.DecodeOutput):
            lengths = np.asarray(output.lengths)  # [B]
            self.tokens += int(np.sum(lengths))
            self.batch_tokens.append(int(np.sum(lengths)))
            self.rows += int(lengths.shape[0])
            self.outputs.append(output)

    @property
    def mean_output_tokens(self) -> float:
        """Tokens generated per example (decoded row), over every batch."""
        return self.tokens / self.rows if self.rows else float("nan")


def interleaved_timings(
    programs: Mapping[Hashable, runner.Program],
    batches: Sequence[dict[str, jax.Array]],
    rngs: Sequence[jax.Array],
    repeats: int,
) -> dict[Hashable, Timed]:
    """Times every program on every batch, all programs on batch j before batch j+1.

    A program is compiled once per batch shape (prompt width), on first use, and warmed up once
    (not timed); a batch's time is the median of `repeats` runs, each run kept too (the speedups'
    bootstrap intervals draw from them). Interleaving puts the plain baseline and each gamma
    under the same machine conditions (a drift in load or clock affects all of them alike).
    """
    timed = {name: Timed() for name in programs}
    runs = runner.run_batches(programs, zip(batches, rngs), repeats=repeats, warmup=True)
    for j, (batch, result) in enumerate(zip(batches, runs)):
        for name in programs:
            timed[name].add(
                result.outputs[name], result.seconds[name], result.compile_s.get(name, 0.0),
                result.repeat_seconds[name],
            )  # fmt: skip
        shape = tuple(inputs.input_tokens(batch).shape)
        seconds = ", ".join(f"{label(n)} {result.seconds[n]:.1f}s" for n in programs)
        log.info(f"batch {j + 1}/{len(batches)} {shape}: {seconds}")
    return timed


def label(name: Hashable) -> str:
    """A program's name in progress lines: "plain", "draft prefill", "gamma 3", "bigram gamma 2"."""
    if isinstance(name, str):
        return name
    variant, gamma = name
    return f"gamma {gamma}" if variant == "default" else f"{variant} gamma {gamma}"


def cell_programs(
    setup: Setup, s: Settings, sampling: SamplingConfig
) -> dict[Hashable, runner.Program]:
    """The prefills (the target's, each draft model's), plain decoding and every variant of the
    cell at each of its gammas (keys (variant name, gamma))."""
    target, drafts, partitioner = setup.target, setup.all_drafts(), s.models.partitioner
    plain = decoding.DecodeConfig(s.inputs.max_decode_len, setup.stop_ids, sampling)
    programs: dict[Hashable, runner.Program] = {
        "target prefill": runner.Prefill(target.model, target.params, plain),
        "plain": runner.Decoder(target.model, target.params, plain, partitioner=partitioner),
    }
    variants = s.sweep.at(sampling.temperature)
    for i in sorted({s.sweep.draft_of[v.name] for v in variants}):
        prefilled = prefilled_model(drafts[i])
        if prefilled is not None:
            programs[prefill_key(i)] = runner.Prefill(*prefilled, plain)
    for v in variants:
        draft = drafts[s.sweep.draft_of[v.name]]
        for gamma in v.gammas:
            spec = s.sweep.specs[(v.name, gamma)]
            config = decoding.DecodeConfig.from_spec(
                spec, s.inputs.max_decode_len, setup.stop_ids, sampling
            )
            try:
                programs[(v.name, gamma)] = runner.Decoder(
                    target.model, target.params, config, draft.model, draft.params, partitioner
                )
            except ValueError as e:  # e.g. a tree this draft cannot grow
                raise JobError(f"variant {v.name!r}: {e}") from None
    return programs


def prefilled_model(draft: Loaded) -> tuple[Any, Any] | None:
    """(model, params) a draft prefills its own cache with: a draft model's, or a staged
    drafter's model's (timed alone so that decode-only speedups leave it out as they leave the
    target's out); None for a drafter that prefills no model of its own."""
    if draft.is_model:
        return draft.model, draft.params
    if isinstance(draft.model, staged.StagedDrafter):
        return draft.model.model, draft.model.model_params(draft.params)
    return None


def prefill_key(draft_index: int) -> str:
    return "draft prefill" if draft_index == 0 else f"draft {draft_index + 1} prefill"


def time_cell(
    setup: Setup,
    batches: Sequence[dict[str, jax.Array]],
    s: Settings,
    sampling: SamplingConfig,
) -> dict[Hashable, Timed]:
    """Every program of a cell (`cell_programs`) timed on every batch.

    Each program is compiled once per prompt width (ahead of time, timed apart) and rerun on every
    batch of that width; batch j uses the same rng for plain and speculative decoding. The
    prefills are timed alone too, so that decode-only speedups can be reported beside end-to-end.
    """
    rngs = [jax.random.fold_in(jax.random.PRNGKey(s.run.seed), j) for j in range(len(batches))]
    programs = cell_programs(setup, s, sampling)
    timed = interleaved_timings(programs, batches, rngs, s.run.repeats)
    compile_s = ", ".join(f"{label(n)} {t.compile_s:.1f}s" for n, t in timed.items())
    log.info(f"compile: {compile_s}")
    return timed


def step_costs(setup: Setup, s: Settings, batch: dict[str, jax.Array]) -> dict[str, Any]:
    """The costs of a batch size, measured once for all its cells: the target's step and its
    verify calls at every gamma (timed once, whatever the drafts), and per distinct draft its step
    and c ("draft_costs"); draft_step_s and c at the top are the first draft's."""
    target, gammas = setup.target, s.sweep.gammas
    verify = list(s.sweep.verify_lengths)
    cache_len = target.model.cache_length(setup.width, s.inputs.max_decode_len, max(verify))
    draft_config = decoding.DecodeConfig(s.inputs.max_decode_len, setup.stop_ids, gamma=max(gammas))
    target_side = timing.target_costs(target.model, target.params, batch, cache_len, verify)
    step = target_side["target_step_s"]
    draft_costs = []
    for draft in setup.all_drafts():
        t = timing.draft_step_time(draft.model, draft.params, batch, cache_len, draft_config)
        draft_costs.append({"draft_step_s": t, "c": t / step})
    if s.sweep.named:
        log.info(
            "draft costs: "
            + ", ".join(
                f"{d.description}: c {dc['c']:.3f}"
                for d, dc in zip(setup.all_drafts(), draft_costs)
            )
        )
    return {
        "draft_costs": draft_costs,
        "target_step_s": step,
        **draft_costs[0],
        "target_extend_s": target_side["target_extend_s"],
    }


def sampling_round_costs(
    setup: Setup, s: Settings, batch: dict[str, jax.Array], temperature: float
) -> dict[tuple, float]:
    """Seconds of one round's sampling work outside the models at this batch size, per round
    the cell runs (`round_key`: each variant's rule, tree and lenience at each of its gammas)."""
    rows = inputs.input_tokens(batch).shape[0]
    vocab_size = setup.target.model.vocab_size
    sampling = s.sweep.sampling(temperature)
    costs = {}
    for v in s.sweep.at(temperature):
        for gamma in v.gammas:
            key = round_key(v, gamma)
            if key not in costs:
                costs[key] = timing.sampling_round_time(
                    rows, vocab_size, gamma, sampling, v.acceptance, v.tree, v.lenience
                )
    return costs
