"""Core benchmark on this machine: plain vs speculative decoding, random-weight decoder-only models.

Target: 8 layers, emb 512; draft: 2 layers, emb 256 (both vocab 32000, float32), batch 1.
For each gamma: baseline tokens/s, speculative tokens/s, alpha, tau, measured c, the Theorem 3.8
prediction and the measured speedup, all in one run; compile time reported apart.
Random weights give a tiny alpha, so the table also has the target as its own draft (alpha = 1):
tau = gamma + 1 there, and speedup / tau shows the loop and verify overhead.

    python scripts/benchmark_core.py [--out outputs/benchmark_core.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from speculative import decoding
from speculative.measure import metrics, runner, timing
from speculative.models import decoder


def build(emb, layers, heads, seed, vocab):
    config = decoder.DecoderConfig(
        vocab_size=vocab,
        emb_dim=emb,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=64,
        mlp_dim=4 * emb,
        max_seq_len=2048,
    )
    model = decoder.DecoderLM(config)
    return model, model.init_params(jax.random.PRNGKey(seed))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="outputs/benchmark_core.json")
    parser.add_argument("--max_decode_len", type=int, default=128)
    parser.add_argument("--gammas", default="1,2,3,4,5,6,7,8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=32000)
    args = parser.parse_args()
    gammas = [int(g) for g in args.gammas.split(",")]

    target, target_params = build(512, 8, 8, 0, args.vocab)
    draft, draft_params = build(256, 2, 4, 1, args.vocab)
    prompt = jax.random.randint(jax.random.PRNGKey(2), (1, 32), 1, args.vocab)
    batch = {"prompt": prompt, "prompt_lengths": jnp.array([32], jnp.int32)}
    # eos_id outside the vocabulary: every run generates exactly max_decode_len tokens.
    common = dict(max_decode_len=args.max_decode_len, stop_ids=(args.vocab,))

    plain = runner.Decoder(target, target_params, decoding.DecodeConfig(**common))
    run_plain, compile_s = runner.compiled_call(plain, batch)
    _, base_s, base_out = timing.time_call(run_plain, args.repeats)
    tokens = int(base_out.lengths.sum())
    cache_len = 32 + args.max_decode_len
    t_target = timing.decode_step_time(target, target_params, batch, cache_len, args.repeats)
    t_draft = timing.decode_step_time(draft, draft_params, batch, cache_len, args.repeats)
    c = t_draft / t_target
    print(
        f"jax {jax.__version__} on {jax.devices()[0].platform}, batch 1, {tokens} new tokens, float32"
    )
    print(f"plain decoding: {tokens / base_s:.1f} tok/s (compile {compile_s:.1f}s, apart)")
    print(
        f"one-token step: target {t_target * 1e3:.2f} ms, draft {t_draft * 1e3:.2f} ms, c = {c:.3f}"
    )

    rows = []
    header = (
        f"{'draft':>6} {'gamma':>5} {'alpha':>6} {'tau':>5} {'tok/s':>7} {'speedup':>7} "
        f"{'predicted':>9} {'compile_s':>9}"
    )
    print(header)
    for name, (d, dp) in {"random": (draft, draft_params), "self": (target, target_params)}.items():
        c_row = c if name == "random" else 1.0
        for gamma in gammas:
            config = decoding.DecodeConfig(**common, gamma=gamma)
            run_spec, first_s = runner.compiled_call(
                runner.Decoder(target, target_params, config, d, dp), batch
            )
            _, spec_s, out = timing.time_call(run_spec, args.repeats)
            assert np.array_equal(out.tokens, base_out.tokens), "greedy outputs differ"
            summary = metrics.summarize(out.stats, out.lengths)
            row = {
                "draft": name,
                "gamma": gamma,
                "alpha": summary["alpha"],
                "tau": summary["tau"],
                "c": c_row,
                "baseline_tok_s": tokens / base_s,
                "speculative_tok_s": tokens / spec_s,
                "speedup": base_s / spec_s,
                "predicted_speedup": metrics.predicted_speedup(summary["alpha"], gamma, c_row),
                "compile_s": first_s,
            }
            rows.append(row)
            print(
                f"{name:>6} {gamma:>5} {row['alpha']:>6.3f} {row['tau']:>5.2f} "
                f"{row['speculative_tok_s']:>7.1f} {row['speedup']:>7.2f} "
                f"{row['predicted_speedup']:>9.2f} {first_s:>9.1f}"
            )
    result = {
        "setup": {
            "target": "decoder 8 layers emb 512 (random weights)",
            "draft": "decoder 2 layers emb 256 (random weights)",
            "batch": 1,
            "prompt_len": 32,
            "max_decode_len": args.max_decode_len,
            "dtype": "float32",
            "platform": jax.devices()[0].platform,
            "jax": jax.__version__,
        },
        "baseline": {"tok_s": tokens / base_s, "compile_s": compile_s},
        "step_ms": {"target": t_target * 1e3, "draft": t_draft * 1e3, "c": c},
        "rows": rows,
    }
    out_path = pathlib.Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
