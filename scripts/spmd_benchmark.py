"""SPMD sanity benchmark: time per speculative round, sharded vs unsharded, on 8 host devices;
and the memory report (bytes per device) of the paper's T5 configs on TPU v4-8 / H100 / H200.

The 8 devices are XLA:CPU host devices sharing this machine's cores, so the sharded figures measure
partitioning overhead (collectives between threads), not a speed-up. Random-weight decoder pair:
target 4 layers, emb 512, 8 heads (4 kv heads), vocab 8192; draft 1 layer, emb 256 (float32);
batch 8, gamma 4, greedy, the target as its own draft as well (so every round emits gamma + 1).
Compile time is reported apart; time per round = median run time / number of rounds.

    python scripts/spmd_benchmark.py [--out outputs/spmd_benchmark.json]
"""

from __future__ import annotations

import os

# Before JAX starts: the device count of the CPU backend is fixed at initialisation.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    os.environ["XLA_FLAGS"] = flags.strip()

import argparse  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from speculative import decoding  # noqa: E402
from speculative.measure import memory, runner, timing  # noqa: E402
from speculative.models import decoder  # noqa: E402
from speculative.parallel import partitioning  # noqa: E402

MESHES = [(1, 8), (2, 4), (4, 2), (8, 1)]


def build(emb, layers, heads, kv_heads, seed, vocab):
    config = decoder.DecoderConfig(
        vocab_size=vocab,
        emb_dim=emb,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=emb // heads,
        mlp_dim=4 * emb,
        max_seq_len=1024,
    )
    model = decoder.DecoderLM(config)
    return model, model.init_params(jax.random.PRNGKey(seed))


def time_rounds(target, draft, batch, args, partitioner):
    """(compile s, median s per round, rounds, tokens) of one compiled speculative decode."""
    config = decoding.DecodeConfig(args.max_decode_len, (-1,), gamma=args.gamma)
    decoder_ = runner.Decoder(*target, config, *draft, partitioner=partitioner)
    run, compile_s = runner.compiled_call(decoder_, batch)
    _, median, out = timing.time_call(run, args.repeats)
    rounds = int(np.max(np.asarray(out.stats["target_calls"])))
    return compile_s, median / rounds, rounds, np.asarray(out.tokens)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="outputs/spmd_benchmark.json")
    parser.add_argument("--max_decode_len", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"devices: {jax.device_count()} x {jax.devices()[0].platform}")

    vocab = 8192
    target = build(512, 4, 8, 4, 0, vocab)
    drafts = {"random draft": build(256, 1, 4, 4, 1, vocab), "self draft": target}
    rng = np.random.default_rng(0)
    batch = {
        "prompt": rng.integers(1, vocab, size=(args.batch, 16)).astype(np.int32),
        "prompt_lengths": np.full((args.batch,), 16, np.int32),
    }
    rows = []
    for name, draft in drafts.items():
        base_compile, base_round, rounds, ref = time_rounds(target, draft, batch, args, None)
        rows.append(
            dict(
                draft=name,
                mesh="unsharded",
                compile_s=base_compile,
                ms_per_round=1e3 * base_round,
                rounds=rounds,
                vs_unsharded=1.0,
                identical=True,
            )
        )
        for shape in MESHES:
            p = partitioning.create_partitioner(*shape)
            compile_s, per_round, rounds, tokens = time_rounds(target, draft, batch, args, p)
            rows.append(
                dict(
                    draft=name,
                    mesh=f"{shape[0]}x{shape[1]}",
                    compile_s=compile_s,
                    ms_per_round=1e3 * per_round,
                    rounds=rounds,
                    vs_unsharded=per_round / base_round,
                    identical=bool(np.array_equal(tokens, ref)),
                )
            )
    print(
        f"\nTime per speculative round, batch {args.batch}, gamma {args.gamma}, "
        f"max_decode_len {args.max_decode_len}, greedy, float32 (8 XLA:CPU host devices)"
    )
    for r in rows:
        r["compile_s"] = round(r["compile_s"], 2)
        r["ms_per_round"] = round(r["ms_per_round"], 2)
        r["vs_unsharded"] = round(r["vs_unsharded"], 2)
    print(memory.format_table(rows))

    # Memory of the benchmark models on a 2x4 mesh, and of the paper configs.
    mesh = {"data": 2, "model": 4}
    bench_mem = {
        "target_params": memory.param_bytes(target[0], partitioning.TARGET_RULES, mesh, "float32"),
        "draft_params": memory.param_bytes(
            drafts["random draft"][0], partitioning.DRAFT_RULES, mesh, "float32"
        ),
        "target_cache": memory.state_bytes(
            target[0],
            partitioning.TARGET_RULES,
            mesh,
            args.batch,
            16,
            args.max_decode_len,
            args.gamma,
        ),
    }
    print(f"\nbenchmark models, bytes per device on a 2x4 mesh: {bench_mem}")
    paper = {}
    for batch_size in (1, 64):
        paper[batch_size] = memory.paper_report(batch_size=batch_size)
        print(
            f"\nT5 v1.1 XXL (bf16) + drafts, GiB per device: batch {batch_size}, input 512, "
            "decode 128, gamma 7"
        )
        print(memory.format_table(paper[batch_size]))

    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "config": vars(args),
                "rounds": rows,
                "benchmark_memory": bench_mem,
                "paper_memory": paper,
            },
            indent=1,
        )
    )
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
