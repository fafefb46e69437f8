"""Main job: speculative vs plain decoding of real pretrained weights on HumanEval prompts.

Default: Qwen2.5-Coder-1.5B-Instruct (target) with Qwen2.5-Coder-0.5B-Instruct (draft), both GGUF
weights fetched once from the package registry and dequantised to float32, greedy, gamma 4.
Prints the completions, alpha, tau, measured c, tokens/s of both decoders (each batch is run by
plain then by speculative decoding before the next), the measured speedup, the Theorem 3.8
prediction, and the measured cost of the verify call (gamma + 1 target tokens) with the prediction
it gives in place of Thm 3.8's one step; compile time is reported apart.

    python -m speculative.demo [--prompts 3] [--max_decode_len 64] [--gamma 4] [--temperature 0]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

from speculative import checkpoints, decoding, fetch, inputs, metrics, prompts, timing, vocab
from speculative import model_loading as ml
from speculative.sampling import SamplingConfig


def load(name: str):
    """(model, params, vocabulary) of a registry model, fetched on first use."""
    from speculative.models import decoder

    path = fetch.ensure_model(name)
    start = time.perf_counter()
    config, params = checkpoints.load_gguf(path, dtype=jnp.float32)
    print(
        f"loaded {name}: {config.num_layers} layers, emb {config.emb_dim}, "
        f"{sum(x.size for x in jax.tree_util.tree_leaves(params)) / 1e9:.2f}B params "
        f"in {time.perf_counter() - start:.1f}s"
    )
    return decoder.DecoderLM(config), params, vocab.from_gguf(path)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b", choices=sorted(fetch.MODELS))
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b", choices=sorted(fetch.MODELS))
    parser.add_argument("--prompts", type=int, default=3, help="first N HumanEval problems")
    parser.add_argument("--batch_size", type=int, default=1)
    parser.add_argument("--max_decode_len", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top_k", type=int, default=0)
    parser.add_argument("--top_p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="outputs/demo.json")
    args = parser.parse_args(argv)
    cfg = SamplingConfig(args.temperature, args.top_k, args.top_p)

    target, target_params, target_vocab = load(args.target)
    draft, draft_params, draft_vocab = load(args.draft)
    vocab.check_compatible(draft_vocab, target_vocab)
    problems = prompts.humaneval_prompts(args.prompts)
    common = dict(max_decode_len=args.max_decode_len, sampling=cfg, eos_id=target_vocab.stop_ids)

    print(
        f"\njax {jax.__version__} on {jax.devices()[0].platform}, float32, batch {args.batch_size}, "
        f"gamma {args.gamma}, {cfg}"
    )
    encoded = [target_vocab.encode(p["prompt"]) for p in problems]
    width = max(len(ids) for ids in encoded)
    chunks = [
        range(i, min(i + args.batch_size, len(problems)))
        for i in range(0, len(problems), args.batch_size)
    ]

    def batch_of(chunk):
        # A short last chunk is filled with copies of its last prompt (dropped from the results)
        # so that every chunk has one static shape and reuses one compiled program.
        ids = [encoded[i] for i in chunk] + [encoded[chunk[-1]]] * (args.batch_size - len(chunk))
        return inputs.decoder_batch(ids, pad_to=width)

    first = batch_of(chunks[0])
    rng = jax.random.PRNGKey(args.seed)
    run_plain, compile_plain = decoding.compile_autoregressive(
        target, target_params, first, rng=rng, **common
    )
    run_spec, compile_spec = decoding.compile_speculative(
        target, target_params, draft, draft_params, first, gamma=args.gamma, rng=rng, **common
    )
    compile_s = {"plain": compile_plain, "speculative": compile_spec}
    rows, plain_s, spec_s, tokens, all_stats = [], 0.0, 0.0, 0, []
    for number, chunk in enumerate(chunks):
        batch, rng = batch_of(chunk), jax.random.PRNGKey(args.seed + number)
        t0 = time.perf_counter()
        plain = timing.block(run_plain(batch, rng))
        plain_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        spec = timing.block(run_spec(batch, rng))
        spec_s += time.perf_counter() - t0
        real = len(chunk)
        tokens += int(np.sum(spec.lengths))  # padding rows are timed too, so count them
        all_stats.append(
            (
                {k: np.asarray(v)[:real] for k, v in spec.stats.items()},
                np.asarray(spec.lengths)[:real],
            )
        )
        for i, index in enumerate(chunk):
            problem = problems[index]
            n = int(spec.lengths[i])
            text = target_vocab.decode(spec.tokens[i, :n].tolist(), skip_special_tokens=True)
            same = bool(np.array_equal(spec.tokens[i], plain.tokens[i]))
            rows.append(
                {
                    "task_id": problem["task_id"],
                    "completion": text,
                    "tokens": n,
                    "alpha": float(spec.stats["alpha"][i]),
                    "tau": float(spec.stats["tokens_per_call"][i]),
                    "identical_to_plain": same if cfg.greedy else None,
                }
            )
            print(
                f"\n=== {problem['task_id']} (alpha {rows[-1]['alpha']:.2f}, "
                f"tau {rows[-1]['tau']:.2f}"
                + (f", identical to plain greedy: {same}" if cfg.greedy else "")
                + ") ===",
                flush=True,
            )
            print(problem["prompt"].rstrip("\n")[-300:] + "\033[1m" + text + "\033[0m", flush=True)

    stats = {k: np.concatenate([np.asarray(s[k]) for s, _ in all_stats]) for k in all_stats[0][0]}
    summary = metrics.summarize(stats, np.concatenate([np.asarray(x) for _, x in all_stats]))
    probe = inputs.decoder_batch([encoded[0]])
    cache_len = len(encoded[0]) + args.max_decode_len + args.gamma + 1
    costs = timing.measure_c(
        ml.Loaded(target, target_params, args.target),
        ml.Loaded(draft, draft_params, args.draft),
        probe,
        cache_len,
        verify_lengths=[args.gamma + 1],
    )
    c, t_target, t_draft = costs["c"], costs["target_step_s"], costs["draft_step_s"]
    t_verify = costs["target_extend_s"][args.gamma + 1]
    result = {
        "target": args.target,
        "draft": args.draft,
        "batch_size": args.batch_size,
        "gamma": args.gamma,
        "sampling": dataclasses.asdict(cfg),
        "tokens": tokens,
        "alpha": summary["alpha"],
        "tau": summary["tau"],
        "c": c,
        "target_step_s": t_target,
        "draft_step_s": t_draft,
        "plain_tok_s": tokens / plain_s,
        "speculative_tok_s": tokens / spec_s,
        "speedup": plain_s / spec_s,
        "predicted_speedup": metrics.predicted_speedup(summary["alpha"], args.gamma, c),
        "target_verify_s": t_verify,
        "cost_model_speedup": metrics.cost_model_speedup(
            summary["tau"], args.gamma, t_target, t_draft, t_verify
        ),
        "optimal_gamma": metrics.optimal_gamma(summary["alpha"], c),
        "compile_s": compile_s,
        "acceptance_by_position": summary["acceptance_by_position"],
        "rows": rows,
    }
    print(
        f"\n{args.target} <- draft {args.draft}: {tokens} tokens, batch {args.batch_size}, "
        f"gamma {args.gamma}"
    )
    print(
        f"alpha {summary['alpha']:.3f}   tau {summary['tau']:.2f} tokens/target call   "
        f"c {c:.3f} (draft step {t_draft * 1e3:.0f} ms / target step {t_target * 1e3:.0f} ms)"
    )
    print(
        f"plain {result['plain_tok_s']:.2f} tok/s   speculative {result['speculative_tok_s']:.2f} "
        f"tok/s   speedup {result['speedup']:.2f}x   (Thm 3.8 predicts "
        f"{result['predicted_speedup']:.2f}x; optimal gamma {result['optimal_gamma']})"
    )
    print(
        f"verify call (target scoring {args.gamma + 1} tokens) {t_verify * 1e3:.0f} ms = "
        f"{t_verify / t_target:.2f} target steps (Thm 3.8 assumes 1); with that cost the model "
        f"predicts {result['cost_model_speedup']:.2f}x"
    )
    print(
        f"compile (apart): plain {compile_s['plain']:.1f}s, speculative "
        f"{compile_s['speculative']:.1f}s"
    )
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
