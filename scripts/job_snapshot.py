"""Snapshots of the jobs' outputs on the tiny random-weight pair, to show a refactor changed nothing.

    .venv/bin/python scripts/job_snapshot.py /tmp/before            # on the old commit
    .venv/bin/python scripts/job_snapshot.py /tmp/after --compare /tmp/before

Runs the infer job (configs/demo/tiny_random_models.gin, 6 prompts, batch 2, gamma 3) greedy and
sampled, plain and speculative, with every draft kind the tiny pair can run (model, shortlist head,
n-gram tables, prompt lookup, layer skip, staged), every gamma policy, lenience, the block and
traversal rules and a token tree, and a small benchmark sweep; writes each case's
predictions.jsonl under OUT/<case>/ and the key paths of benchmark.json to OUT/bench_keys.txt. With --compare, each predictions.jsonl must be
byte-identical to the reference's and the benchmark keys equal; exit 1 names what differs.
Takes about 3 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import pathlib
import shutil
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROMPTS = ["abcabcabc", "Hi", "x = 1; x = 1; x", "Hello, Hello,", "def f(x): return x", "zz"]
SAMPLED = ["--gin.TEMPERATURE=1.0", "--gin.TOP_K=20", "--gin.SEED=3"]
PADDED_259 = [  # the byte vocabulary's own size, so a shortlist head can cover it
    "--gin.target/decoder.DecoderConfig.vocab_size=259",
    "--gin.draft/decoder.DecoderConfig.vocab_size=259",
]


def cases(tables: pathlib.Path) -> dict[str, list[str]]:
    """Case name -> extra flags (gin files first) on top of the tiny infer job."""
    ngram = [f"--gin.NGRAM_TABLES='{tables}'"]
    return {
        "plain_greedy": ["--gin.SPECULATIVE=False"],
        "plain_sampled": ["--gin.SPECULATIVE=False", *SAMPLED],
        "model_greedy": [],
        "model_sampled": SAMPLED,
        "model_topp": ["--gin.TEMPERATURE=0.8", "--gin.TOP_P=0.9", "--gin.SEED=5"],
        "gamma1": ["--gin.GAMMA=1", *SAMPLED],
        "lenient": ["--gin.LENIENCE=0.5", *SAMPLED],
        "shortlist": ["--gin.DRAFT_SHORTLIST=40", *PADDED_259],
        "confidence": ["--gin_file=configs/drafts/confidence_stop.gin", *SAMPLED],
        "schedule": ["--gin_file=configs/drafts/schedule.gin"],
        "prompt_lookup": ["--gin_file=configs/drafts/prompt_lookup.gin", *SAMPLED],
        "prompt_lookup_greedy": ["--gin_file=configs/drafts/prompt_lookup.gin"],
        "unigram": ["--gin_file=configs/drafts/unigram.gin", *ngram, *SAMPLED],
        "bigram": ["--gin_file=configs/drafts/bigram.gin", *ngram],
        "bigram_sampled": ["--gin_file=configs/drafts/bigram.gin", *ngram, *SAMPLED],
        "layer_skip": ["--gin_file=configs/drafts/layer_skip.gin", *SAMPLED],
        "layer_skip_greedy": ["--gin_file=configs/drafts/layer_skip.gin"],
        "staged_sampled": ["--gin.draft/speculative.ModelSpec.staged_lookahead=2", *SAMPLED],
        "block_sampled": ["--gin.ACCEPTANCE='block'", *SAMPLED],
        "tree_greedy": ["--gin.TREE=(2, 1, 1)"],
        "tree_sampled": ["--gin.TREE=(2, 1, 1)", *SAMPLED],
        "traversal_sampled": ["--gin.TREE=(2, 1, 1)", "--gin.ACCEPTANCE='traversal'", *SAMPLED],
    }


def infer_argv(inputs: pathlib.Path, out: pathlib.Path, extra: list[str]) -> list[str]:
    files = [e for e in extra if e.startswith("--gin_file")]
    bindings = [e for e in extra if not e.startswith("--gin_file")]
    return [
        "--gin_file=configs/runs/infer.gin",
        "--gin_file=configs/demo/tiny_random_models.gin",
        *files,
        "--gin.speculative.InferConfig.measure_c=False",
        "--gin.speculative.InferConfig.progress=False",
        "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 12}",
        "--gin.BATCH_SIZE=2",
        "--gin.GAMMA=3",
        f"--gin.INPUT_FILE='{inputs}'",
        "--gin.COMPILATION_CACHE_DIR=None",
        f"--gin.OUTPUT_DIR='{out}'",
        *bindings,
    ]


def key_paths(value, prefix: str = "") -> set[str]:
    """Every key path of a JSON value (lists by their first element)."""
    if isinstance(value, dict):
        paths = set()
        for k, v in value.items():
            paths |= {f"{prefix}/{k}"} | key_paths(v, f"{prefix}/{k}")
        return paths
    if isinstance(value, list) and value:
        return key_paths(value[0], prefix + "[]")
    return set()


def snapshot(out: pathlib.Path) -> None:
    from speculative import benchmark, fit_ngram, infer
    from speculative.measure import report as benchmark_report

    out.mkdir(parents=True, exist_ok=True)
    inputs = out / "in.jsonl"
    inputs.write_text("".join(json.dumps({"inputs": t}) + "\n" for t in PROMPTS))
    tables = out / "tables.npz"
    argv = ["--vocab_kind=byte", f"--input_file={inputs}", "--vocab_size=264", f"--out={tables}"]
    if fit_ngram.main(argv) != 0:
        raise SystemExit("fit_ngram failed")
    for name, extra in cases(tables).items():
        shutil.rmtree(out / name, ignore_errors=True)
        infer.main(infer_argv(inputs, out / name, extra))
    bench = out / "bench"
    shutil.rmtree(bench, ignore_errors=True)
    benchmark.main(
        [
            "--gin_file=configs/runs/benchmark.gin",
            "--gin_file=configs/demo/tiny_random_models.gin",
            f"--gin.INPUT_FILE='{inputs}'",
            f"--gin.OUTPUT_DIR='{bench}'",
            "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 8}",
            "--gin.BATCH_SIZES=[1, 2]",
            "--gin.GAMMAS=[2]",
            "--gin.NUM_EXAMPLES=2",
            "--gin.COMPILATION_CACHE_DIR=None",
        ]
    )
    keys = key_paths(benchmark_report.read_benchmark(bench / "benchmark.json"))
    (out / "bench_keys.txt").write_text("\n".join(sorted(keys)) + "\n")


def compare(out: pathlib.Path, reference: pathlib.Path) -> list[str]:
    """What differs between two snapshots (empty when nothing does)."""
    differ = []
    for name in cases(pathlib.Path()):
        ours, theirs = out / name / "predictions.jsonl", reference / name / "predictions.jsonl"
        if not theirs.exists() or not filecmp.cmp(ours, theirs, shallow=False):
            differ.append(f"{name}/predictions.jsonl")
    if (out / "bench_keys.txt").read_text().split() != (
        reference / "bench_keys.txt"
    ).read_text().split():
        differ.append("bench_keys.txt")
    return differ


def main(argv: list[str] | None = None) -> int:
    """0; 1 when the snapshots differ; 2 after one line `error: ...` (a job's result file
    missing or torn: `errors.read_result_json`)."""
    from speculative.config import gin_flags

    status = []
    return gin_flags.run_job(lambda a: status.append(_main(a)), argv) or status[0]


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--compare", type=pathlib.Path, help="a reference snapshot directory")
    parser.add_argument("--debug", action="store_true", help="a traceback instead of one line")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    os.chdir(ROOT)  # the configs include each other by repository-relative paths
    snapshot(out)
    if args.compare is None:
        return 0
    differ = compare(out, args.compare.resolve())
    total = len(cases(pathlib.Path()))
    print(
        f"{total - len([d for d in differ if d != 'bench_keys.txt'])} of {total} predictions.jsonl "
        f"byte-identical; benchmark.json keys {'differ' if 'bench_keys.txt' in differ else 'equal'}"
    )
    for d in differ:
        print(f"differs: {d}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
