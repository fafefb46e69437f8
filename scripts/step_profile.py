#!/usr/bin/env python
"""Where a one-row bfloat16 decode step spends its time, from XLA:CPU's own per-operation trace.

Issue 39's limit is the draft's step. `scripts/draft_anatomy.py` inferred that the time outside
the weight products went to ~540 small operations; this measures every operation instead:
the step runs in a `lax.fori_loop` under `jax.profiler.trace` with XLA:CPU's per-thunk trace
events on (`xla_cpu_enable_xprof_traceme`), and the events are summed per kind:
  - each library dot (the matrix-unit route), grouped by what it computes (query, key, value,
    out, wi_0 gate, wi_1 up, wo down, the output head, attention's two products), with the bytes
    of weight it reads and the bandwidth that implies;
  - every other operation (norms, RoPE, the cache writes, softmax, residual adds) together.
XLA:CPU runs independent operations concurrently (the gate and up products, the query, key and
value products), so the per-kind sums can exceed the step's wall time; the step's wall time is
the trace's own.
Then a bare product: one [N, K] bfloat16 weight times two rows, float32 accumulation, the way
`base.dense` calls it, for the draft's and the target's weight shapes, in a loop over 24
distinct weights (no cache reuse), to give the library's streaming rate per shape.

Real weights (Qwen2.5-Coder 0.5B with its 32,768-id shortlist head as the draft, 1.5B as the
target, GGUF dequantised straight into bfloat16), the first HumanEval prompt in the cache.
Prints tables and writes JSON (--out). Run on a quiet machine.

    .venv/bin/python scripts/step_profile.py --out benchmarks/step_profile
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import pathlib
import re
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from speculative import checkpoints
from speculative.loading import fetch
from speculative.measure import timing
from speculative.models import decoder, precision

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from draft_anatomy import first_prompt, load_draft  # noqa: E402  (as the anatomy loads them)
from matrix_units import cpu_model, write_report  # noqa: E402  (the scripts' shared pieces)

STEPS = 10  # decode steps traced
PROJECTIONS = ("query", "key", "value", "out", "wi_0", "wi_1", "wo", "logits_dense")


def load_target() -> tuple[decoder.DecoderLM, dict, dict, int]:
    """The 1.5B target in bfloat16 with `load_draft`'s prompt batch and cache length."""
    config, params = checkpoints.load_gguf(
        fetch.ensure_model("qwen2.5-coder-1.5b"), dtype=jnp.bfloat16
    )
    _, _, batch, cache_len = first_prompt()
    return decoder.DecoderLM(config), params, batch, cache_len


def kind_of(op_name: str) -> str:
    """What a library dot computes, from its HLO metadata (attention's products carry none)."""
    for part in PROJECTIONS:
        if f"/{part}/" in op_name:
            return "head" if part == "logits_dense" else part
    return "attention" if op_name == "" else "other dot"


def dot_kinds(hlo: str) -> dict[str, str]:
    """library fusion name -> kind, in a compiled program's text."""
    found = {}
    for line in hlo.splitlines():
        m = re.match(r"\s+%(ynn_fusion[.\d]*) = \S+ fusion\(", line)
        if m:
            op = re.search(r'op_name="([^"]*)"', line)
            found[m.group(1)] = kind_of(op.group(1) if op else "")
    return found


def projection_bytes(params: dict) -> dict[str, int]:
    """kind -> bytes of weight one step reads for it (summed over layers)."""
    found: dict[str, int] = collections.Counter()
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = [getattr(k, "key", "") for k in path]
        if names[-1] != "kernel":
            continue
        kind = kind_of("/" + "/".join(names) + "/")
        found[kind] += leaf.nbytes
    return dict(found)


def traced_loop(model, params, batch: dict, cache_len: int):
    """(compiled loop of STEPS one-row steps with per-thunk trace events, its operands, library
    fusion name -> kind)."""
    options = dict(precision.COMPILER_OPTIONS or {}, xla_cpu_enable_xprof_traceme=True)
    state = jax.jit(
        lambda p, b: model.extend(p, model.init_state(p, b, cache_len), b["prompt"])[1],
        compiler_options=precision.COMPILER_OPTIONS,
    )(params, batch)

    def loop(p, s):
        def step(_, carry):
            state, token = carry
            logits, new = model.extend(p, state, token)
            # the decode loop's own consumer (a greedy pick); the index stays, so every step
            # reads the same cache
            return new.replace(index=state.index), jnp.argmax(logits, -1).astype(jnp.int32)

        return jax.lax.fori_loop(0, STEPS, step, s)

    operands = (params, (state, batch["prompt"][:, -1:]))
    compiled = jax.jit(loop, compiler_options=options).lower(*operands).compile()
    return compiled, operands, dot_kinds(compiled.as_text())


def trace_once(compiled, operands, kinds: dict) -> dict:
    """One traced run: per-kind thunk microseconds and calls, and the loop's wall time."""
    jax.block_until_ready(compiled(*operands))
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            jax.block_until_ready(compiled(*operands))
        trace = glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True)[0]
        events = json.load(gzip.open(trace))
    events = events["traceEvents"] if isinstance(events, dict) else events
    us: dict[str, float] = collections.Counter()
    calls: dict[str, int] = collections.Counter()
    for event in events:
        name = event.get("name", "")
        if event.get("ph") != "X":
            continue
        if name == "ThunkExecutor::Execute (wait for completion)":
            us["wall"] += event["dur"]
        elif name in kinds:
            us[kinds[name]] += event["dur"]
            calls[kinds[name]] += 1
        elif not name.startswith(("end:", "ThunkExecutor", "$", "SlinkyThreadPool")) and (
            "fusion" in name or name.startswith(("wrapped_", "copy", "dynamic"))
        ):
            us["other operations"] += event["dur"]
            calls["other operations"] += 1
    return {"us": us, "calls": calls}


def profile_step(model, params, batch: dict, cache_len: int, rounds: int) -> dict:
    """Per-kind thunk time (ms a step, median over `rounds` traces) of the one-row step as the
    decode loop compiles it, interleaved with the untraced step time (`timing.decode_step_time`)."""
    compiled, operands, kinds = traced_loop(model, params, batch, cache_len)
    traces, untraced = [], []
    for _ in range(rounds):
        traces.append(trace_once(compiled, operands, kinds))
        untraced.append(timing.decode_step_time(model, params, batch, cache_len) * 1e3)
    names = {k for t in traces for k in t["us"]}
    ms = {k: statistics.median(t["us"].get(k, 0.0) for t in traces) / STEPS / 1e3 for k in names}
    wall = ms.pop("wall")
    return {
        "traced_step_ms": wall,
        "ms": ms,
        "calls": {k: traces[0]["calls"][k] / STEPS for k in ms},
        "untraced_step_ms": statistics.median(untraced),
        "untraced_samples_ms": untraced,
        "traced_samples_ms": [t["us"]["wall"] / STEPS / 1e3 for t in traces],
    }


def bare_product(n: int, k: int, layers: int = 24, iters: int = 10) -> float:
    """Seconds per [n, k] bfloat16 weight x two rows (float32 accumulation), over `layers`
    distinct weights in a loop; every output element is consumed."""
    rng = np.random.default_rng(0)
    weights = [
        jnp.asarray(rng.standard_normal((n, k), np.float32) * 0.01, jnp.bfloat16)
        for _ in range(layers)
    ]

    def run(x, ws):
        def body(_, x):
            for w in ws:
                rows = x.astype(jnp.bfloat16)
                y = jnp.einsum("nk,mk->nm", w, rows, preferred_element_type=jnp.float32)
                x = x + 1e-9 * jnp.sum(y, axis=0)[:, None]  # every output element is used
            return x

        return jax.lax.fori_loop(0, iters, body, x)

    fn = jax.jit(run, compiler_options=precision.COMPILER_OPTIONS)
    x = jnp.ones((2, k), jnp.float32)
    jax.block_until_ready(fn(x, weights))
    times = []
    for _ in range(5):
        start = time.perf_counter()
        jax.block_until_ready(fn(x, weights))
        times.append(time.perf_counter() - start)
    return sorted(times)[2] / iters / layers


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="outputs/step_profile")
    parser.add_argument("--rounds", type=int, default=3, help="traces per model (medians)")
    args = parser.parse_args(argv)
    report = {"cpu": cpu_model(), "jax": jax.__version__, "models": {}}
    for label, load in (
        ("0.5B draft, 32,768-id shortlist head", load_draft),
        ("1.5B target", load_target),
    ):
        model, params, batch, cache_len = load()
        report["cache_len"] = cache_len
        found = profile_step(model, params, batch, cache_len, args.rounds)
        found["weight_bytes"] = projection_bytes(params)
        report["models"][label] = found
        del model, params
    shapes = {
        "draft q / out [896, 896]": (896, 896),
        "draft gate / up [4864, 896]": (4864, 896),
        "draft down [896, 4864]": (896, 4864),
        "target q / out [1536, 1536]": (1536, 1536),
        "target gate / up [8960, 1536]": (8960, 1536),
        "target down [1536, 8960]": (1536, 8960),
    }
    report["bare_product_us"] = {label: bare_product(*nk) * 1e6 for label, nk in shapes.items()}
    report["bare_product_gb_s"] = {
        label: shapes[label][0] * shapes[label][1] * 2 / (us * 1e-6) / 1e9
        for label, us in report["bare_product_us"].items()
    }
    report["read_bandwidth_gb_s"] = timing.read_bandwidth() / 1e9
    print_report(report)
    write_report(args.out, "step_profile.json", report)
    return report


def print_report(report: dict) -> None:
    print(f"{report['cpu']}, jax {report['jax']}, one row, cache {report['cache_len']}")
    for label, found in report["models"].items():
        print(
            f"\n{label}: traced step {found['traced_step_ms']:.1f} ms, "
            f"untraced {found['untraced_step_ms']:.1f} ms"
        )
        print(
            "| operations | calls a step | ms a step | weight MB | GB/s |\n| --- | --- | --- | --- | --- |"
        )
        for kind, ms in sorted(found["ms"].items(), key=lambda kv: -kv[1]):
            mb = found["weight_bytes"].get(kind, 0) / 1e6
            rate = f"{mb / ms:.1f}" if mb else ""
            print(f"| {kind} | {found['calls'][kind]:.0f} | {ms:.2f} | {mb:.1f} | {rate} |")
    print("\n| bare product, two rows | us | GB/s |\n| --- | --- | --- |")
    for label, us in report["bare_product_us"].items():
        print(f"| {label} | {us:.0f} | {report['bare_product_gb_s'][label]:.1f} |")
    print(f"read bandwidth probe: {report['read_bandwidth_gb_s']:.1f} GB/s")


if __name__ == "__main__":
    main()
