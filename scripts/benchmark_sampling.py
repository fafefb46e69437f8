"""Times the jitted sampling kernels at the Qwen2.5 vocabulary (V = 151,936), float32 logits.

    .venv/bin/python scripts/benchmark_sampling.py [--rows 1 5 9] [--repeats 30] [--out PATH]

Prints a table and writes the same rows as JSON. Each entry is the median of --repeats calls of an
already compiled function (compile and warm-up excluded), also divided by the number of rows.

Two kinds of logits, because the top-p cost depends on the nucleus size:
  peaked: Zipf-like rows (logit = -2 log rank, shuffled); the 0.95-nucleus holds a few tokens, so
    the `lax.top_k` candidates decide the cut.
  flat: standard-normal rows; the 0.95-nucleus holds ~110k tokens, so every row is bisected.
"old sort" rows run `process_logits_by_sort`, the full-sort implementation this replaced.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

from speculative.decoding import sampling
from speculative.decoding.sampling import SamplingConfig

VOCAB = 151_936

PROCESS_CONFIGS = {
    "T=1 (no filter)": SamplingConfig(temperature=1.0),
    "top_k=50": SamplingConfig(temperature=1.0, top_k=50),
    "top_p=0.95": SamplingConfig(temperature=1.0, top_p=0.95),
    "top_p=0.95 top_k=50": SamplingConfig(temperature=1.0, top_k=50, top_p=0.95),
}
OLD_CONFIGS = {
    "old sort top_k=50": SamplingConfig(temperature=1.0, top_k=50),
    "old sort top_p=0.95": SamplingConfig(temperature=1.0, top_p=0.95),
}


def make_logits(kind: str, shape: tuple[int, ...], vocab: int, seed: int = 0) -> jax.Array:
    """[*shape, V] float32 logits of the given kind (see the module docstring)."""
    rng = np.random.default_rng(seed)
    rows = int(np.prod(shape))
    if kind == "peaked":
        zipf = -2.0 * np.log(np.arange(1, vocab + 1))
        values = np.stack([rng.permutation(zipf) for _ in range(rows)])
    elif kind == "flat":
        values = rng.standard_normal((rows, vocab))
    else:
        raise ValueError(kind)
    return jnp.asarray(values.reshape(*shape, vocab), jnp.float32)


def median_ms(compiled: Callable, args: tuple, repeats: int, warmup: int = 3) -> float:
    """Median wall time in ms of `compiled(*args)` (blocking on the result)."""
    for _ in range(warmup):
        jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def compile_fn(fn: Callable, *args) -> Callable:
    return jax.jit(fn).lower(*args).compile()


def process_entries(kind: str, rows: int, vocab: int, repeats: int) -> list[dict]:
    logits = make_logits(kind, (rows,), vocab)
    entries = []
    configs = [(name, cfg, sampling.process_logits) for name, cfg in PROCESS_CONFIGS.items()]
    configs += [(name, cfg, sampling.process_logits_by_sort) for name, cfg in OLD_CONFIGS.items()]
    for name, cfg, fn in configs:
        compiled = compile_fn(lambda x, fn=fn, cfg=cfg: fn(x, cfg), logits)
        ms = median_ms(compiled, (logits,), repeats)
        entries.append(dict(kernel="process_logits", config=name, data=kind, rows=rows, ms=ms))
    return entries


def sample_entries(kind: str, vocab: int, repeats: int) -> list[dict]:
    """`sample` on one row: what each draft step (and plain decoding) pays."""
    logits = make_logits(kind, (1,), vocab, seed=3)
    rng = jax.random.PRNGKey(0)
    entries = []
    for name, cfg in (
        ("greedy", SamplingConfig()),
        ("T=1 (no filter)", SamplingConfig(temperature=1.0)),
        ("top_p=0.95", SamplingConfig(temperature=1.0, top_p=0.95)),
    ):
        compiled = compile_fn(lambda r, x, cfg=cfg: sampling.sample(r, x, cfg)[0], rng, logits)
        ms = median_ms(compiled, (rng, logits), repeats)
        entries.append(dict(kernel="sample (tokens)", config=name, data=kind, rows=1, ms=ms))
    return entries


def verify_entries(kind: str, vocab: int, repeats: int, batch: int = 1, gamma: int = 4):
    target = make_logits(kind, (batch, gamma + 1), vocab, seed=1)
    draft = make_logits(kind, (batch, gamma), vocab, seed=2)
    rng = jax.random.PRNGKey(0)
    entries = []
    cases = [
        ("greedy", SamplingConfig(), False),
        ("T=1 top_p=0.95", SamplingConfig(temperature=1.0, top_p=0.95), False),
        ("T=1 top_p=0.95, old sort filter", SamplingConfig(temperature=1.0, top_p=0.95), True),
    ]
    for name, cfg, old_filter in cases:
        tokens, _ = jax.jit(sampling.sample, static_argnums=2)(rng, draft, cfg)
        args = (rng, target, draft, tokens)
        fn = lambda r, t, d, x, cfg=cfg: sampling.verify_detailed(r, t, d, x, cfg)  # noqa: E731
        if old_filter:
            # Trace verify_detailed with the full-sort filter in place of process_logits.
            with mock.patch.object(sampling, "process_logits", sampling.process_logits_by_sort):
                compiled = compile_fn(fn, *args)
        else:
            compiled = compile_fn(fn, *args)
        ms = median_ms(compiled, args, repeats)
        rows = batch * (2 * gamma + 1)  # logit rows it standardises: G+1 target, G draft
        entries.append(
            dict(
                kernel=f"verify_detailed B={batch} G={gamma}",
                config=name,
                data=kind,
                rows=rows,
                ms=ms,
            )
        )
    return entries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 5, 9])
    parser.add_argument("--vocab", type=int, default=VOCAB)
    parser.add_argument("--repeats", type=int, default=30, help="timed calls per entry (>= 30)")
    parser.add_argument("--data", nargs="+", default=["peaked", "flat"], choices=["peaked", "flat"])
    parser.add_argument("--out", default="/tmp/benchmark_sampling.json", help="JSON output path")
    args = parser.parse_args()

    load_before = os.getloadavg()
    entries = []
    for kind in args.data:
        for rows in args.rows:
            entries += process_entries(kind, rows, args.vocab, args.repeats)
        entries += sample_entries(kind, args.vocab, args.repeats)
        entries += verify_entries(kind, args.vocab, args.repeats)
    for entry in entries:
        entry["ms_per_row"] = entry["ms"] / entry["rows"]

    print(f"{'kernel':24} {'config':34} {'data':7} {'rows':>4} {'ms':>9} {'ms/row':>9}")
    for e in entries:
        print(
            f"{e['kernel']:24} {e['config']:34} {e['data']:7} {e['rows']:>4} "
            f"{e['ms']:>9.3f} {e['ms_per_row']:>9.3f}"
        )
    meta = dict(
        vocab=args.vocab,
        repeats=args.repeats,
        jax=jax.__version__,
        backend=jax.default_backend(),
        cpu_count=os.cpu_count(),
        loadavg_before=load_before,
        loadavg_after=os.getloadavg(),
        time=time.strftime("%Y-%m-%d %H:%M:%S"),
    )
    print(f"load average before/after: {load_before} / {meta['loadavg_after']}")
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, entries=entries), f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
