"""The batch loop the jobs share: programs compiled ahead of time once per batch shape, then run on
every batch, timed with the compilation apart.

A program is plain or speculative decoding bound to its weights and `DecodeConfig` (`Decoder`), or
the prefill alone (`Prefill`, which the benchmark times to report decode-only speedups); anything
with `compile(batch, rng) -> (run(batch, rng), seconds)` will do. `run_batches` runs every program
on batch j before batch j + 1, so drifting machine load hits them all alike, and yields one
`BatchRun` per batch; the caller writes, prints or pools it (the inference job appends rows to its
output, the demo prints completions, the benchmark keeps every repeat and the medians).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from typing import Any, Protocol

import jax

from speculative import decoding
from speculative.data import inputs
from speculative.decoding.drafter import Drafter
from speculative.measure import timing
from speculative.models import precision
from speculative.models.base import LanguageModel

Batch = dict[str, jax.Array]
Run = Callable[[Batch, jax.Array], Any]


class Program(Protocol):
    def compile(self, batch: Batch, rng: jax.Array) -> tuple[Run, float]:
        """(run(batch, rng) for every batch shaped like `batch`, seconds the compilation took)."""
        ...


@dataclasses.dataclass(frozen=True, eq=False)
class Decoder:
    """Decoding of `target` by `config`: speculative with a draft (config.gamma set), else plain.

    With a `partitioning.Partitioner` the loop is compiled SPMD on its mesh: params are placed by
    its rules (a no-op for params loaded onto their shards) and each batch's rows on 'data'. The
    draft becomes a `Drafter` and is checked against the target once, here; each batch is
    checked once, by `validate` (`run_batches` calls it before running a batch).
    """

    target: LanguageModel
    target_params: Any
    config: decoding.DecodeConfig
    draft: LanguageModel | Drafter | None = None
    draft_params: Any = None
    partitioner: Any = None
    drafter: Drafter | None = dataclasses.field(init=False, default=None)  # the draft, as one

    def __post_init__(self):
        drafter = None
        if self.draft is not None:  # checked against the target and the tree as the api checks
            drafter = decoding.resolve_drafter(self.target, self.draft, self.config)
        object.__setattr__(self, "drafter", drafter)

    @property
    def speculative(self) -> bool:
        return self.draft is not None

    def validate(self, batch: Batch) -> None:
        """Raises ValueError when `batch` cannot be decoded (as `speculative_decode` would)."""
        decoding.validate_inputs(self.target, batch, self.config, self.drafter)

    def compile(self, batch: Batch, rng: jax.Array) -> tuple[Run, float]:
        """The loop compiled for `batch`'s shape (validate the batch first): the api's call
        (`decoding.prepare`), compiled ahead of time so that its runs are timed without it."""
        call = decoding.prepare(
            self.target, self.target_params, self.config, self.drafter, self.draft_params,
            self.partitioner,
        )  # fmt: skip
        compiled, seconds = timing.compile_ahead(
            call.loop, *call.arguments(batch, rng), **call.static
        )

        def run(batch: Batch, rng: jax.Array) -> decoding.DecodeOutput:
            return call.finish(compiled(*call.params, *call.inputs(batch, rng)))

        return run, seconds


def compiled_call(
    decoder: Decoder, batch: Batch, rng: jax.Array | None = None
) -> tuple[Callable[[], decoding.DecodeOutput], float]:
    """`decoder` compiled ahead for `batch`: (a no-argument call decoding it, compile seconds), the
    form `timing.time_call` times (scripts/benchmark_core.py, scripts/spmd_benchmark.py)."""
    rng = jax.random.PRNGKey(0) if rng is None else rng
    decoder.validate(batch)
    run, seconds = decoder.compile(batch, rng)
    return (lambda: run(batch, rng)), seconds


@dataclasses.dataclass(frozen=True, eq=False)
class Prefill:
    """The prefill alone of `model` (what every decode of a batch pays before its first token)."""

    model: LanguageModel
    params: Any
    config: decoding.DecodeConfig

    def compile(self, batch: Batch, rng: jax.Array) -> tuple[Run, float]:
        cache_len = self.config.cache_length(self.model, batch)
        fn = jax.jit(
            lambda params, b: decoding.prefill(self.model, params, b, cache_len),
            compiler_options=precision.COMPILER_OPTIONS,  # as the loops compile
        )
        compiled, seconds = timing.compile_ahead(fn, self.params, batch)
        return (lambda b, _rng: compiled(self.params, b)), seconds


@dataclasses.dataclass(frozen=True)
class BatchRun:
    """One batch through every program.

    outputs: program -> its result on the batch (a DecodeOutput for a `Decoder`), last repeat.
    seconds: program -> wall seconds of one run (the median over repeats), compilation excluded.
    compile_s: program -> seconds spent compiling it for this batch; only programs that met the
      batch's shape for the first time are present.
    repeat_seconds: program -> the wall seconds of each of its `repeats` runs, in order (what
      the median is of; the benchmark bootstraps its speedups from them).
    warmup_s: program -> seconds of its untimed first run (with warmup), like compile_s only
      for programs that met the batch's shape for the first time.
    """

    outputs: dict[Hashable, Any]
    seconds: dict[Hashable, float]
    compile_s: dict[Hashable, float]
    repeat_seconds: dict[Hashable, list[float]] = dataclasses.field(default_factory=dict)
    warmup_s: dict[Hashable, float] = dataclasses.field(default_factory=dict)


def run_batches(
    programs: Mapping[Hashable, Program],
    batches: Iterable[tuple[Batch, jax.Array]],
    repeats: int = 1,
    warmup: bool = False,
) -> Iterator[BatchRun]:
    """Runs every program on each (batch, rng) in turn; yields a `BatchRun` per batch.

    Each batch is first checked by every program that can check one (`validate(batch)`, raising
    ValueError). Each program is compiled once per batch shape [B, W], on first use; with warmup,
    it is then run once untimed (first-run costs kept out of the timings). Each timed run ends
    with the outputs on the device (one host sync per run).
    """
    compiled: dict[tuple[Hashable, tuple[int, ...]], Run] = {}
    for batch, rng in batches:
        shape = tuple(inputs.input_tokens(batch).shape)
        outputs, seconds, compile_s, repeat_seconds, warmup_s = {}, {}, {}, {}, {}
        for program in programs.values():
            if hasattr(program, "validate"):
                program.validate(batch)
        for name, program in programs.items():
            try:
                if (name, shape) not in compiled:
                    run, compile_s[name] = program.compile(batch, rng)
                    if warmup:
                        start = time.perf_counter()
                        timing.block(run(batch, rng))
                        warmup_s[name] = time.perf_counter() - start
                    compiled[name, shape] = run
                run = compiled[name, shape]
                times = []
                for _ in range(repeats):
                    start = time.perf_counter()
                    outputs[name] = timing.block(run(batch, rng))
                    times.append(time.perf_counter() - start)
            except FloatingPointError as e:  # NaN logits: say which program (a variant's name)
                e.program = name
                raise
            seconds[name] = statistics.median(times)
            repeat_seconds[name] = times
        yield BatchRun(outputs, seconds, compile_s, repeat_seconds, warmup_s)
