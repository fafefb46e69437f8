"""One-shot accelerator benchmark: the costs speculative decoding depends on, at real model sizes.

Random weights at real shapes (no checkpoint needed), bfloat16 parameters and activations by
default (logits stay float32). Measures, on whatever device JAX sees first:

- T5 v1.1 XXL (the paper's target): the verify call, an `extend` by n = 1..8 tokens, against one
  step; c of the small, base and large drafts; Thm 3.8's speedup for every row of the paper's
  Table 2 from the paper's own α with our measured c, and the same with the measured verify cost
  in place of one step (metrics.cost_model_speedup), printed next to the paper's measured speedup.
- Qwen2.5-1.5B target / 0.5B draft shapes: the same verify costs and c at batch 1, 8 and 32, and
  the cost-model speedup at the best γ per batch for a given α, with the crossover batch size.

Writes benchmark.json and benchmark.md under --out and, with --append_docs, appends the markdown to
docs/benchmarks.md. Designed to finish in under 8 minutes on one GPU or TPU host (most of it is
compilation); `--tiny` runs the same code with toy sizes on a CPU in seconds (the default suite).

    python scripts/accelerator_benchmark.py --out benchmarks/accelerator --append_docs
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import pathlib
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp

from speculative.measure import memory, metrics, planner, timing
from speculative.measure import report as benchmark_report
from speculative.models import decoder, t5

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Leviathan et al. 2023, Table 2 (T5-XXL target, batch 1, TPU-v4): task, draft, T, γ, α, speedup.
PAPER_TABLE_2 = (
    ("EnDe", "small", 0, 7, 0.75, 3.4),
    ("EnDe", "base", 0, 7, 0.80, 2.8),
    ("EnDe", "large", 0, 7, 0.82, 1.7),
    ("EnDe", "small", 1, 7, 0.62, 2.6),
    ("EnDe", "base", 1, 5, 0.68, 2.4),
    ("EnDe", "large", 1, 3, 0.71, 1.4),
    ("CNNDM", "small", 0, 5, 0.65, 3.1),
    ("CNNDM", "base", 0, 5, 0.73, 3.0),
    ("CNNDM", "large", 0, 3, 0.74, 2.2),
    ("CNNDM", "small", 1, 5, 0.53, 2.3),
    ("CNNDM", "base", 1, 3, 0.55, 2.2),
    ("CNNDM", "large", 1, 3, 0.56, 1.7),
)

# Qwen2.5-1.5B / 0.5B shapes (the GGUF metadata of the Qwen2.5-Coder pair the CPU benchmarks use).
QWEN_TARGET = decoder.DecoderConfig(
    vocab_size=151936, emb_dim=1536, num_layers=28, num_heads=12, num_kv_heads=2, head_dim=128,
    mlp_dim=8960, rope_theta=1e6, qkv_bias=True, max_seq_len=32768,
)  # fmt: skip
QWEN_DRAFT = decoder.DecoderConfig(
    vocab_size=151936, emb_dim=896, num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64,
    mlp_dim=4864, rope_theta=1e6, qkv_bias=True, tie_word_embeddings=True, max_seq_len=32768,
)  # fmt: skip
TINY_DECODER = decoder.DecoderConfig(
    vocab_size=256, emb_dim=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=64
)


def _tiny_t5(scale: int) -> t5.T5Config:
    return t5.T5Config(
        vocab_size=128, emb_dim=16 * scale, num_heads=2, num_encoder_layers=scale,
        num_decoder_layers=scale, head_dim=8, mlp_dim=32 * scale, mlp_activations=("gelu", "linear"),
    )  # fmt: skip


def random_params(model: Any, dtype: str, seed: int = 0, eager: bool = False) -> Any:
    """Random parameters of `model`, cast to dtype inside one jit (no float32 copy kept);
    eager skips the compile, for toy sizes."""

    def init(rng):
        params = model.init_params(rng)
        return jax.tree.map(lambda x: x.astype(dtype), params)

    return (init if eager else jax.jit(init))(jax.random.PRNGKey(seed))


def param_bytes(params: Any) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(params))


def verify_costs(
    model: Any, params: Any, batch: dict, cache_len: int, lengths: tuple[int, ...]
) -> dict[int, float]:
    """Median seconds of one `extend` by each length, cache filled (length 1 = a plain step)."""
    return {n: timing.decode_step_time(model, params, batch, cache_len, length=n) for n in lengths}


def best_cost_model_speedup(
    alpha: float, step_s: float, draft_s: float, extend_s: dict[int, float]
) -> tuple[int, float]:
    """(γ, speedup) maximising Thm 3.8's accounting with the measured verify cost (`planner.plan`),
    over the γ whose γ + 1 tokens were measured, even when speculation loses."""
    plan = planner.plan(alpha, step_s, draft_s, extend_s, min_speedup=float("-inf"))
    return plan.gamma, plan.predicted_speedup


def t5_section(tiny: bool, dtype: str, lengths: tuple[int, ...], input_len: int) -> dict[str, Any]:
    """Verify costs of the XXL target, c of each draft, and the paper's Table 2 rows predicted."""
    if tiny:
        configs = {
            "xxl": _tiny_t5(3),
            "small": _tiny_t5(1),
            "base": _tiny_t5(1),
            "large": _tiny_t5(2),
        }
        models = {k: t5.T5(dataclasses.replace(c, dtype=dtype)) for k, c in configs.items()}
    else:
        models = memory.paper_configs(dtype)
    batch = {"encoder_input_tokens": jnp.full((1, input_len), 5, jnp.int32)}
    cache_len = 64
    target_params = random_params(models["xxl"], dtype, eager=tiny)
    extend_s = verify_costs(models["xxl"], target_params, batch, cache_len, lengths)
    step_s = extend_s[1]
    result: dict[str, Any] = {
        "target_bytes": param_bytes(target_params),
        "extend_s": extend_s,
        "verify_over_step": {n: s / step_s for n, s in extend_s.items()},
        "drafts": {},
    }
    del target_params
    for size in ("small", "base", "large"):
        params = random_params(models[size], dtype, eager=tiny)
        draft_s = timing.decode_step_time(models[size], params, batch, cache_len)
        result["drafts"][size] = {
            "step_s": draft_s,
            "c": draft_s / step_s,
            "bytes": param_bytes(params),
        }
        del params
    rows = []
    for task, size, temperature, gamma, alpha, paper_speedup in PAPER_TABLE_2:
        c = result["drafts"][size]["c"]
        draft_s = result["drafts"][size]["step_s"]
        verify = extend_s.get(gamma + 1)
        tau = metrics.expected_tokens_per_call(alpha, gamma)
        rows.append(
            {
                "task": task, "draft": size, "T": temperature, "gamma": gamma, "alpha": alpha,
                "paper_speedup": paper_speedup, "c": c,
                "thm_3_8": metrics.predicted_speedup(alpha, gamma, c),
                "cost_model": None if verify is None
                else metrics.cost_model_speedup(tau, gamma, step_s, draft_s, verify),
            }
        )  # fmt: skip
    result["table_2"] = rows
    return result


def qwen_section(
    tiny: bool, dtype: str, lengths: tuple[int, ...], batches: tuple[int, ...], alpha: float
) -> dict[str, Any]:
    """Per batch size: verify costs, c, and the cost-model speedup at the best γ for `alpha`."""
    target_cfg, draft_cfg = (TINY_DECODER, TINY_DECODER) if tiny else (QWEN_TARGET, QWEN_DRAFT)
    target = decoder.DecoderLM(dataclasses.replace(target_cfg, dtype=dtype))
    draft = decoder.DecoderLM(dataclasses.replace(draft_cfg, dtype=dtype))
    target_params = random_params(target, dtype, eager=tiny)
    draft_params = random_params(draft, dtype, 1, eager=tiny)
    prompt_len = 8 if tiny else 128
    cache_len = prompt_len + 32
    result: dict[str, Any] = {
        "alpha": alpha,
        "target_bytes": param_bytes(target_params),
        "draft_bytes": param_bytes(draft_params),
        "batches": [],
    }
    for b in batches:
        batch = {"prompt": jnp.full((b, prompt_len), 7, jnp.int32)}
        extend_s = verify_costs(target, target_params, batch, cache_len, lengths)
        draft_s = timing.decode_step_time(draft, draft_params, batch, cache_len)
        gamma, speedup = best_cost_model_speedup(alpha, extend_s[1], draft_s, extend_s)
        result["batches"].append(
            {
                "batch": b,
                "extend_s": extend_s,
                "verify_over_step": {n: s / extend_s[1] for n, s in extend_s.items()},
                "draft_step_s": draft_s,
                "c": draft_s / extend_s[1],
                "best_gamma": gamma,
                "speedup": speedup,
            }
        )
    result["crossover_batch"] = benchmark_report.crossover_batch(result["batches"])
    return result


def markdown(result: dict[str, Any]) -> str:
    """The run as markdown: T5 verify costs and Table 2, then the Qwen batch table."""
    t5r, qw = result["t5"], result["qwen"]
    lengths = sorted(t5r["verify_over_step"])
    out = [
        f"## Accelerator benchmark ({result['device']}, {result['dtype']}, {result['date']})",
        "",
        f"`{result['command']}`; random weights at real shapes; compile apart; total "
        f"{result['wall_s']:.0f} s.",
        "",
        f"**T5 v1.1 XXL verify call** ({t5r['target_bytes'] / 1e9:.1f} GB of parameters; one step "
        f"{1e3 * t5r['extend_s'][1]:.1f} ms at batch 1):",
        "",
        "| tokens | " + " | ".join(str(n) for n in lengths) + " |",
        "|---" * (len(lengths) + 1) + "|",
        "| cost / one step | "
        + " | ".join(f"{t5r['verify_over_step'][n]:.2f}" for n in lengths)
        + " |",
        "",
        "| draft | bytes | step ms | c |",
        "|---|---:|---:|---:|",
    ]
    for size, d in t5r["drafts"].items():
        out.append(
            f"| T5 v1.1 {size} | {d['bytes'] / 1e9:.2f} GB | {1e3 * d['step_s']:.2f} | {d['c']:.3f} |"
        )
    out += [
        "",
        "Paper's Table 2 with the paper's α and the c measured here:",
        "",
        "| task | draft | T | γ | α (paper) | paper speedup | Thm 3.8 | cost model (measured verify) |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in t5r["table_2"]:
        cost = "—" if r["cost_model"] is None else f"{r['cost_model']:.2f}x"
        out.append(
            f"| {r['task']} | {r['draft']} | {r['T']} | {r['gamma']} | {r['alpha']:.2f} | "
            f"{r['paper_speedup']:.1f}x | {r['thm_3_8']:.2f}x | {cost} |"
        )
    out += [
        "",
        f"**Qwen2.5-1.5B / 0.5B shapes**, cost model at α = {qw['alpha']:.3f}:",
        "",
        "| batch | step ms | draft step ms | c | verify γ+1 = 5 / 8 tokens (steps) | best γ | predicted speedup |",
        "|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in qw["batches"]:
        v = r["verify_over_step"]
        out.append(
            f"| {r['batch']} | {1e3 * r['extend_s'][1]:.2f} | {1e3 * r['draft_step_s']:.2f} | "
            f"{r['c']:.3f} | {v.get(5, float('nan')):.2f} / {v.get(8, float('nan')):.2f} | "
            f"{r['best_gamma']} | {r['speedup']:.2f}x |"
        )
    cross = qw["crossover_batch"]
    out.append("")
    out.append(
        "Crossover: none within the measured batch sizes."
        if cross is None
        else f"Crossover (predicted speedup = 1.0) at batch ≈ {cross:.1f}."
    )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="toy sizes (CPU test)")
    parser.add_argument("--dtype", default="bfloat16", help="parameters and activations")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6, 8])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--input_len", type=int, default=512, help="T5 encoder input length")
    parser.add_argument(
        "--alpha",
        type=float,
        default=0.944,
        help="Qwen pair's α (HumanEval greedy, measured on CPU)",
    )
    parser.add_argument("--out", default="benchmarks/accelerator")
    parser.add_argument("--append_docs", action="store_true", help="append to docs/benchmarks.md")
    args = parser.parse_args(argv)
    lengths = tuple(sorted(set(args.lengths) | {1}))
    start = time.perf_counter()
    result: dict[str, Any] = {
        "device": str(jax.devices()[0].device_kind),
        "dtype": args.dtype,
        "date": datetime.date.today().isoformat(),
        "command": "python scripts/accelerator_benchmark.py " + " ".join(argv or sys.argv[1:]),
        "jax": jax.__version__,
    }
    result["t5"] = t5_section(args.tiny, args.dtype, lengths, args.input_len)
    print(f"T5 done after {time.perf_counter() - start:.0f} s", flush=True)
    result["qwen"] = qwen_section(args.tiny, args.dtype, lengths, tuple(args.batches), args.alpha)
    result["wall_s"] = time.perf_counter() - start
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "benchmark.json").write_text(json.dumps(result, indent=1))
    table = markdown(result)
    (out / "benchmark.md").write_text(table)
    print(table)
    if args.append_docs:
        with open(ROOT / "docs" / "benchmarks.md", "a", encoding="utf-8") as f:
            f.write("\n" + table)
    return result


if __name__ == "__main__":
    main()
