"""The inference job on 8 XLA:CPU host devices: compile time cold and warm, decode time per round
sharded against unsharded, for the tiny config and a mid-size one (issue 15's measurement).

Every run is `python -m speculative.infer` in a fresh process (the device count is fixed when JAX
starts), so what is timed is exactly what a user's command does. Per (config, mesh) the job runs
twice on one fresh compilation-cache directory: the first run compiles (cold), the second reads
the cache (warm). The figures come from each run's summary.json: this_run.compile_s and decode_s
(decode excludes compilation), the compilation_cache hit/miss counts and the rows' target calls.

The 8 devices share this machine's cores, so a sharded run measures partitioning overhead
(collectives between threads, 1/8-sized matmuls), not a speed-up; these are sanity figures.

    python scripts/spmd_job_timing.py [--out benchmarks/spmd_jobs]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

from speculative import errors  # cheap: no JAX in this process
from speculative.config import gin_flags  # cheap: no JAX in this process

ROOT = pathlib.Path(__file__).resolve().parents[1]
MESHES = [None, (2, 4), (4, 2)]
PROMPTS = [
    "def add(a, b):",
    "import numpy as np",
    "Hello, world!",
    "class Stack:",
    "for i in range(10):",
    "x = [1, 2, 3]",
    "The quick brown fox",
    "SELECT * FROM",
    "def fib(n):",
    "while True:",
    "return sorted(",
    "print(",
    "# a comment",
    "if __name__ ==",
    "try:",
    "lambda x:",
]

# The tiny config as shipped, and a mid-size random pair: target 8 layers of width 1024
# (16 heads, 8 kv heads, mlp 4096; 126M parameters), the draft its first 2 layers (same seed).
MID = [
    f"--gin.{role}/decoder.DecoderConfig.{name}={value}"
    for role, layers in (("target", 8), ("draft", 2))
    for name, value in (
        ("emb_dim", 1024),
        ("num_layers", layers),
        ("num_heads", 16),
        ("num_kv_heads", 8),
        ("head_dim", 64),
        ("mlp_dim", 4096),
    )
]
CONFIGS = {
    "tiny (2 + 1 layers, width 64)": ["--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 32}"],
    "mid (8 + 2 layers, width 1024)": MID
    + ["--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 64}"],
}


def run_job(flags: list[str], out: pathlib.Path) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
    command = [sys.executable, "-m", "speculative.infer", *flags, f"--gin.OUTPUT_DIR='{out}'"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"job failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr}")
    return errors.read_result_json(out / "summary.json", ("this_run", "alpha", "tau"))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/spmd_jobs")
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--debug", action="store_true", help="a traceback instead of one line")
    args = parser.parse_args(argv)
    out_dir = ROOT / args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        inputs = tmp / "prompts.jsonl"
        inputs.write_text("".join(json.dumps({"inputs": p}) + "\n" for p in PROMPTS))
        for config, extra in CONFIGS.items():
            reference = None
            for mesh in MESHES:
                name = "unsharded" if mesh is None else f"{mesh[0]}x{mesh[1]}"
                cache = tmp / f"cache_{len(results)}"
                flags = [
                    "--gin_file=configs/runs/infer.gin",
                    "--gin_file=configs/demo/tiny_random_models.gin",
                    *extra,
                    f"--gin.INPUT_FILE='{inputs}'",
                    f"--gin.BATCH_SIZE={args.batch_size}",
                    f"--gin.GAMMA={args.gamma}",
                    f"--gin.COMPILATION_CACHE_DIR='{cache}'",
                    "--gin.speculative.InferConfig.measure_c=False",
                    "--gin.speculative.InferConfig.progress=False",
                ]
                if mesh is not None:
                    flags += [
                        "--gin.PARTITIONER=@partitioning.create_partitioner()",
                        f"--gin.partitioning.create_partitioner.data={mesh[0]}",
                        f"--gin.partitioning.create_partitioner.model={mesh[1]}",
                    ]
                runs = [run_job(flags, tmp / f"out_{len(results)}_{k}") for k in ("cold", "warm")]
                cold, warm = runs
                warm_dir = tmp / f"out_{len(results)}_warm"
                rows = errors.read_result_jsonl(warm_dir / "predictions.jsonl", ("output_ids",))
                tokens = [r["output_ids"] for r in rows]
                if reference is None:
                    reference = tokens
                # Rounds a batch runs = its longest row's target calls; decode_s covers them all.
                rounds = sum(
                    max(r["target_calls"] for r in rows[i : i + args.batch_size])
                    for i in range(0, len(rows), args.batch_size)
                )
                decode_s = min(r["this_run"]["decode_s"] for r in runs)
                result = {
                    "config": config,
                    "mesh": name,
                    "compile_cold_s": cold["this_run"]["compile_s"],
                    "compile_warm_s": warm["this_run"]["compile_s"],
                    "cache_cold": cold["compilation_cache"],
                    "cache_warm": warm["compilation_cache"],
                    "decode_s": [r["this_run"]["decode_s"] for r in runs],
                    "rounds": rounds,
                    "ms_per_round": 1e3 * decode_s / rounds,
                    "alpha": warm["alpha"],
                    "tau": warm["tau"],
                    "tokens_identical_to_unsharded": tokens == reference,
                }
                results.append(result)
                print(json.dumps(result), flush=True)
    base = {r["config"]: r["ms_per_round"] for r in results if r["mesh"] == "unsharded"}
    lines = [
        "| config | mesh | compile cold s | compile warm s (hits) | ms / round | rounds | "
        "vs unsharded | alpha | tokens = unsharded |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['config']} | {r['mesh']} | {r['compile_cold_s']:.1f} | "
            f"{r['compile_warm_s']:.1f} ({r['cache_warm']['hits']}) | {r['ms_per_round']:.1f} | "
            f"{r['rounds']} | {r['ms_per_round'] / base[r['config']]:.2f} | {r['alpha']:.3f} | "
            f"{'yes' if r['tokens_identical_to_unsharded'] else 'NO'} |"
        )
    table = "\n".join(lines)
    print(table)
    meta = {"batch_size": args.batch_size, "gamma": args.gamma, "prompts": len(PROMPTS)}
    (out_dir / "spmd_job_timing.json").write_text(
        json.dumps({**meta, "results": results}, indent=1)
    )
    (out_dir / "spmd_job_timing.md").write_text(table + "\n")


if __name__ == "__main__":
    sys.exit(gin_flags.run_job(main))  # a torn result file: one line `error: ...`, exit 2
