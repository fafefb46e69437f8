"""Which dtype a model computes in on this machine (docs/design.md §9).

`dtype='auto'` (ModelSpec.dtype, gin's DTYPE, the notebook API, the demo) resolves once per
process: bfloat16 on an accelerator, and on a CPU whose matrix units XLA:CPU's bfloat16 dots use
(AMX or AVX512-BF16: a bfloat16 product of two or more rows runs 2-3x faster than float32 rows);
float32 on a CPU without them, where a bfloat16 product falls back to converting every weight to
float32 on each call and is several times slower than float32. The choice and its reason are one
log line. An explicit dtype is kept as asked, with a warning where it is the slow one.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import pathlib

import jax

log = logging.getLogger(__name__)

AUTO = "auto"
# /proc/cpuinfo flags of the units XLA:CPU's bfloat16 x bfloat16 -> float32 dots run on.
BF16_UNIT_FLAGS = ("amx_bf16", "avx512_bf16")


def _library_fusion_option() -> dict[str, str] | None:
    """XLA:CPU's YNNPACK fusions limited to single dots, where this jaxlib has the option."""
    try:
        import jaxlib

        version = tuple(int(p) for p in jaxlib.__version__.split(".")[:2])
    except (ImportError, ValueError):
        return None
    if version < (0, 10):  # older XLA:CPU: no such option (a compile would refuse it)
        return None
    return {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}


# Compile options of every program that runs a model (the decode loops, prefill, the step timers).
# XLA:CPU hands dots to its YNNPACK library (the matrix-unit route), and by default row reductions
# too, but those only above a size threshold: RMSNorm's mean of squares over 1,536 features was
# summed by XLA's loop for one- and two-row calls (plain steps) and by the library for three or
# more (verify blocks), a last-bit difference that bfloat16 rounding of the next product turned
# into a flipped near-tie. Library dots only: every reduction is XLA's own loop, in one order for
# every row count (docs/design.md §9); the dots, where the time goes, keep the library.
COMPILER_OPTIONS = _library_fusion_option()


@dataclasses.dataclass(frozen=True)
class Route:
    """The dtype a model runs in and why (one line for the log and the result files)."""

    dtype: str
    reason: str


def cpu_flags(cpuinfo: str | pathlib.Path = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU feature flags the kernel reports (empty where there is no /proc/cpuinfo)."""
    try:
        text = pathlib.Path(cpuinfo).read_text()
    except OSError:
        return frozenset()
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags.update(value.split())
    return frozenset(flags)


def choose(requested: str, platform: str, flags: frozenset[str], has_route: bool = True) -> Route:
    """The route for a requested dtype ('auto', 'float32', 'bfloat16', ...) on a platform
    ('cpu', 'gpu', 'tpu') whose CPU reports `flags`, for a model family whose projections take
    the matrix-unit route (`has_route`: the decoder-only layout; T5's input-major kernels do not).
    Pure: `resolve` feeds it this machine."""
    units = [f for f in BF16_UNIT_FLAGS if f in flags]
    on_cpu = platform == "cpu"
    if requested != AUTO:
        if requested == "bfloat16" and on_cpu and not units:
            return Route(
                requested,
                "bfloat16 as asked, but this CPU has neither amx_bf16 nor avx512_bf16: XLA:CPU "
                "converts every bfloat16 weight to float32 on each call (several times slower "
                "than float32; DTYPE='auto' picks float32 here)",
            )
        return Route(requested, f"{requested} as asked")
    if not on_cpu:
        return Route("bfloat16", f"auto: bfloat16 on {platform}")
    if units and not has_route:
        return Route(
            "float32",
            "auto: float32, this model family's projections do not take the bfloat16 "
            "matrix-unit route on a CPU (decoder-only models do)",
        )
    if units:
        return Route(
            "bfloat16",
            f"auto: bfloat16, the CPU has {' and '.join(units)} (bfloat16 weights through the "
            "matrix units, float32 accumulation and logits)",
        )
    return Route(
        "float32",
        "auto: float32, the CPU has neither amx_bf16 nor avx512_bf16 (bfloat16 would be slower "
        "than float32 here)",
    )


@functools.cache
def resolve(requested: str, has_route: bool = True) -> Route:
    """`choose` for this machine (the default backend and /proc/cpuinfo), logged once per
    request and process."""
    route = choose(requested, jax.default_backend(), cpu_flags(), has_route)
    if requested == AUTO or route.reason != f"{requested} as asked":
        log.info(f"dtype: {route.reason}")
    return route


# /proc/cpuinfo flags of the units XLA:CPU's int8 x int8 -> int32 dots run on (int8 drafts).
INT8_UNIT_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni")


def choose_draft_quantization(requested: str, platform: str, flags: frozenset[str]) -> Route:
    """A draft's weight format for a requested `ModelSpec.quantize` ('auto', 'int8', ''): 'auto'
    is int8 on a CPU with int8 dot units (`INT8_UNIT_FLAGS`: a two-row int8 product there streams
    its weights at about the bfloat16 byte rate, so half the bytes; docs/benchmarks.md, "int8
    drafts"), else '' (the model's dtype). Route.dtype holds the answer. Pure, as `choose`."""
    if requested != AUTO:
        return Route(requested, f"draft weights {requested or 'in the dtype'} as asked")
    units = [f for f in INT8_UNIT_FLAGS if f in flags]
    if platform != "cpu":
        return Route("", f"auto: the draft's weights in its dtype on {platform}")
    if units:
        return Route("int8", f"auto: int8 draft weights, the CPU has {' and '.join(units)}")
    return Route("", "auto: the draft's weights in its dtype, the CPU has no int8 dot units")


@functools.cache
def resolve_draft_quantization(requested: str) -> Route:
    """`choose_draft_quantization` for this machine, logged once per request and process."""
    route = choose_draft_quantization(requested, jax.default_backend(), cpu_flags())
    if requested == AUTO:
        log.info(f"draft quantization: {route.reason}")
    return route


def resolve_dtype(requested: str, has_route: bool = True) -> str:
    """The dtype name `requested` runs in here ('auto' resolved; others unchanged)."""
    return resolve(requested, has_route).dtype
