#!/usr/bin/env python
"""Where the time of a verify call goes: the target's extend by L tokens, whole and op by op.

Profiles a decoder-only target (default: Qwen2.5-Coder-1.5B dimensions with random float32 weights;
`--gguf PATH` loads real weights) on this machine:
  1. extend by L = 1, 2, 3, 5, 8 tokens at a fixed cache fill (the plain step and verify calls);
  2. each op of one layer, compiled alone with the model's own weight layout (output-major) and,
     for comparison, T5X's input-major layout: time, bytes streamed, GB/s, GFLOP/s;
  3. the weight-streaming bound: a GEMV over a large output-major matrix (GB/s).
Prints markdown tables and writes JSON (--out).

    .venv/bin/python scripts/profile_verify.py --out benchmarks/verify_profile.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform

import jax
import jax.numpy as jnp

from speculative import checkpoints
from speculative.measure import timing
from speculative.models import decoder

QWEN_1_5B = decoder.DecoderConfig(
    vocab_size=151936,
    emb_dim=1536,
    num_layers=28,
    num_heads=12,
    num_kv_heads=2,
    head_dim=128,
    mlp_dim=8960,
    rope_theta=1e6,
    qkv_bias=True,
    tie_word_embeddings=True,
    max_seq_len=32768,
)


def _median_seconds(fn, *args, repeats: int) -> float:
    return timing.time_call(lambda: fn(*args), repeats)[1]


def op_table(cfg: decoder.DecoderConfig, length: int, cache_fill: int, repeats: int) -> list[dict]:
    """Each op of one layer (and the logits) for `length` rows, compiled alone."""
    e, h, k, d, m, v = (
        cfg.emb_dim,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.mlp_dim,
        cfg.vocab_size,
    )
    x = jnp.ones((length, e), jnp.float32)
    rows = []

    def matmul(name, n_out, n_in, count=1):
        inp = jnp.ones((length, n_in), jnp.float32)
        w_out_major = jnp.ones((n_out, n_in), jnp.float32) * 0.01
        ours = jax.jit(lambda x, w: jnp.einsum("mk,nk->mn", x, w))
        t_ours = _median_seconds(ours, inp, w_out_major, repeats=repeats)
        w_in_major = jnp.ones((n_in, n_out), jnp.float32) * 0.01
        t5x = jax.jit(lambda x, w: jnp.einsum("mk,kn->mn", x, w))
        t_t5x = _median_seconds(t5x, inp, w_in_major, repeats=repeats)
        nbytes = 4 * n_out * n_in
        flops = 2 * length * n_out * n_in
        rows.append(
            dict(
                op=name,
                shape=f"[{length},{n_in}]x[{n_out},{n_in}]",
                count=count,
                ms=1e3 * t_ours,
                ms_input_major=1e3 * t_t5x,
                mbytes=nbytes / 1e6,
                gb_s=nbytes / t_ours / 1e9,
                gflop_s=flops / t_ours / 1e9,
            )
        )

    matmul("query", h * d, e)
    matmul("key", k * d, e)
    matmul("value", k * d, e)
    matmul("out", e, h * d)
    matmul("wi_0 (gate)", m, e)
    matmul("wi_1 (up)", m, e)
    matmul("wo (down)", e, m)
    matmul("logits (tied table)", v, e)

    # Attention over a filled cache: scores, mask, softmax, weighted sum (GQA, heads-major cache).
    from speculative.models import attention

    q = jnp.ones((1, length, h, d), jnp.float32)
    cache = jnp.ones((1, k, cache_fill + length, d), jnp.float32)
    positions = cache_fill + jnp.arange(length)[None]
    mask = attention.causal_cache_mask(positions, cache.shape[2])
    attn = jax.jit(lambda q, kc, vc, mask: attention.attend(q, kc, vc, mask, scale=d**-0.5))
    t = _median_seconds(attn, q, cache, cache, mask, repeats=repeats)
    kv_bytes = 2 * cache.nbytes
    rows.append(
        dict(
            op="attention",
            shape=f"L={length}, S={cache.shape[2]}",
            count=1,
            ms=1e3 * t,
            ms_input_major=None,
            mbytes=kv_bytes / 1e6,
            gb_s=kv_bytes / t / 1e9,
            gflop_s=4 * h * length * cache.shape[2] * d / t / 1e9,
        )
    )
    rope = jax.jit(lambda x, p: decoder.apply_rope(x, p, cfg.rope_theta))
    t = _median_seconds(rope, q, positions, repeats=repeats)
    rows.append(dict(op="rope (q)", shape=f"[{length},{h},{d}]", count=2, ms=1e3 * t, mbytes=0.0))
    del x
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", help="real weights (default: random, Qwen2.5-1.5B dimensions)")
    parser.add_argument("--lengths", default="1,2,3,5,8")
    parser.add_argument("--cache_fill", type=int, default=256, help="valid cache positions")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ops", action="store_true", help="also time each op alone")
    parser.add_argument("--out", default="/tmp/verify_profile.json")
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]

    if args.gguf:
        cfg, params = checkpoints.load_gguf(args.gguf)
        source = os.path.basename(args.gguf)
    else:
        cfg, source = QWEN_1_5B, "random weights, Qwen2.5-Coder-1.5B dimensions"
        params = jax.jit(decoder.DecoderLM(cfg).init_params)(jax.random.PRNGKey(0))
    model = decoder.DecoderLM(cfg)
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    print(f"model: {source}, {weight_bytes / 1e9:.2f} GB float32", flush=True)

    bandwidth = timing.read_bandwidth()
    print(f"GEMV streaming bound: {bandwidth / 1e9:.1f} GB/s", flush=True)
    prompt = jnp.ones((1, args.cache_fill), jnp.int32)
    batch = {"prompt": prompt, "prompt_lengths": jnp.full((1,), args.cache_fill, jnp.int32)}
    cache_len = args.cache_fill + max(lengths) + 1
    extend = {}
    for n in lengths:
        extend[n] = timing.decode_step_time(
            model, params, batch, cache_len, repeats=args.repeats, length=n
        )
        print(
            f"extend by {n}: {1e3 * extend[n]:.1f} ms = {extend[n] / extend[lengths[0]]:.2f} "
            "one-token steps",
            flush=True,
        )
    one = extend[lengths[0]]
    print("\n| tokens | ms | / one-token step | weight GB/s |")
    print("|---|---|---|---|")
    for n in lengths:
        t = extend[n]
        print(f"| {n} | {1e3 * t:.1f} | {t / one:.2f} | {weight_bytes / t / 1e9:.1f} |")
    print(
        f"\none-token step = {100 * weight_bytes / one / bandwidth:.0f}% of the GEMV streaming "
        f"bound ({weight_bytes / bandwidth * 1e3:.0f} ms)"
    )

    ops = {}
    if args.ops:
        del params
        for n in lengths:
            ops[n] = op_table(cfg, n, args.cache_fill, args.repeats * 4)
            print(f"\nops at L = {n} (one layer; x{cfg.num_layers} layers, logits once)")
            print("| op | shape | ms | ms input-major | MB | GB/s | GFLOP/s |")
            print("|---|---|---|---|---|---|---|")
            for r in ops[n]:
                im = r.get("ms_input_major")
                print(
                    f"| {r['op']} | {r['shape']} | {r['ms']:.3f} | "
                    f"{'' if im is None else f'{im:.3f}'} | {r['mbytes']:.1f} | "
                    f"{r.get('gb_s', 0):.1f} | {r.get('gflop_s', 0):.1f} |"
                )
            layer = sum(r["ms"] * r["count"] for r in ops[n] if not r["op"].startswith("logits"))
            logits = next(r["ms"] for r in ops[n] if r["op"].startswith("logits"))
            print(
                f"sum of ops: {cfg.num_layers} x {layer:.2f} + logits {logits:.2f} = "
                f"{cfg.num_layers * layer + logits:.1f} ms (measured extend {1e3 * extend[n]:.1f})"
            )
    result = dict(
        model=source,
        weight_bytes=weight_bytes,
        cache_fill=args.cache_fill,
        gemv_bandwidth_gb_s=bandwidth / 1e9,
        extend_ms={n: 1e3 * t for n, t in extend.items()},
        extend_over_one_step={n: t / one for n, t in extend.items()},
        ops=ops,
        machine=dict(cpus=os.cpu_count(), platform=platform.platform(), jax=jax.__version__),
        xla_flags=os.environ.get("XLA_FLAGS", ""),
    )
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
