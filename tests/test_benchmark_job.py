"""The gin-configured benchmark job (speculative.benchmark) on tiny random-weight models.

Checks the bookkeeping (JSON, plots, Theorem 3.8 numbers, greedy identity, memory skipping), not
speed: timings on tiny models are noise.
"""

from __future__ import annotations

import json
import os
import pathlib

import jax
import numpy as np
import pytest

from speculative import benchmark, metrics
from speculative.models import decoder

ROOT = pathlib.Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


def test_benchmark_job_end_to_end(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    inputs = tmp_path / "in.jsonl"
    # Byte vocabulary: 5, 5 and 14 tokens, so the two batches of 2 pad to widths 8 and 16.
    inputs.write_text('{"inputs": "Hello"}\n{"inputs": "x = 1"}\n{"inputs": "def add(a, b):"}\n')
    out = tmp_path / "bench"
    result = benchmark.main(
        [
            "--gin_file=configs/runs/benchmark.gin",
            "--gin_file=configs/demo/tiny_random_models.gin",
            f"--gin.INPUT_FILE='{inputs}'",
            f"--gin.OUTPUT_DIR='{out}'",
            "--gin.GAMMAS=[2, 3]",
            "--gin.TEMPERATURES=[0.0]",
            "--gin.BATCH_SIZES=[2, 1000000]",  # the second cannot fit and must be skipped
            "--gin.REPEATS=1",
            "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 8}",
        ]
    )
    on_disk = json.loads((out / "benchmark.json").read_text())
    assert on_disk["cells"] == json.loads(json.dumps(result["cells"]))
    assert [s["batch_size"] for s in result["skipped"]] == [1000000]
    assert [(c["batch_size"], c["temperature"]) for c in result["cells"]] == [(2, 0.0)]
    assert result["stop_ids"] == [1]  # the byte vocabulary's EOS
    assert result["xla_flags"] == os.environ.get("XLA_FLAGS", "")
    assert result["stream_floor_s_per_step"] == pytest.approx(
        result["target_weight_bytes"] / result["read_bandwidth_bytes_s"]
    )
    for cell in result["cells"]:
        assert cell["input_widths"] == [8, 16]
        assert cell["c"] == pytest.approx(cell["draft_step_s"] / cell["target_step_s"])
        assert cell["optimal_gamma"] == metrics.optimal_gamma(cell["alpha"], cell["c"])
        assert [p["gamma"] for p in cell["points"]] == [2, 3]
        for p in cell["points"]:
            assert p["speedup"] == pytest.approx(p["speculative_tok_s"] / p["plain_tok_s"])
            assert len(p["plain_batch_s"]) == len(p["speculative_batch_s"]) == 2
            assert p["plain_s"] == pytest.approx(sum(p["plain_batch_s"]))
            plain_decode = (p["plain_s"] - p["target_prefill_s"]) / p["plain_tokens"]
            spec_decode = (p["speculative_s"] - p["target_prefill_s"] - p["draft_prefill_s"]) / p[
                "speculative_tokens"
            ]
            assert p["decode_speedup"] == pytest.approx(plain_decode / spec_decode)
            verify_s = cell["target_extend_s"][p["gamma"] + 1]
            assert p["cost_model_speedup"] == pytest.approx(
                p["tau"] * cell["target_step_s"] / (p["gamma"] * cell["draft_step_s"] + verify_s)
            )
            assert p["predicted_speedup"] == pytest.approx(
                metrics.predicted_speedup(p["alpha"], p["gamma"], cell["c"])
            )
            assert len(p["acceptance_by_position"]) == p["gamma"]
            # 3 inputs in batches of 2 -> 2 batches, inputs cycled to fill the second.
            assert p["plain_tokens"] <= 4 * 8 and p["speculative_tokens"] <= 4 * 8
            assert p["plain_compile_s"] > 0 and p["speculative_compile_s"] > 0
            assert p["greedy_identical_to_plain"] is True  # temperature 0
            assert p["speculative_tokens"] == p["plain_tokens"]
    for name in ("speedup_vs_gamma.png", "speedup_vs_batch.png", "acceptance_by_position.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000
    table = benchmark.markdown_table(result)
    assert table.count("\n") == 2 + 2 - 1  # header, rule, one row per gamma


def test_interleaved_timings_compile_once_per_width_and_run_in_batch_order():
    calls = []

    def compiler(name):
        def compile_fn(batch, rng):
            width = batch["prompt"].shape[1]
            calls.append(("compile", name, width))

            def run(b, r):
                calls.append(("run", name, b["prompt"].shape[1]))
                return b["prompt"]

            return run, 0.5

        return compile_fn

    batches = [{"prompt": np.zeros((1, w), np.int32)} for w in (8, 8, 16, 8)]
    rngs = [jax.random.PRNGKey(j) for j in range(4)]
    result = benchmark.interleaved_timings(
        {"a": compiler("a"), "b": compiler("b")}, batches, rngs, repeats=2
    )
    assert [c for c in calls if c[0] == "compile"] == [
        ("compile", "a", 8),
        ("compile", "b", 8),
        ("compile", "a", 16),
        ("compile", "b", 16),
    ]
    timed_runs = [c[1:] for c in calls if c[0] == "run"]
    # Per batch: a's warm-up on a new width, a twice, then b likewise; a and b alternate batches.
    assert timed_runs[:6] == [("a", 8)] * 3 + [("b", 8)] * 3
    assert result["a"]["compile_s"] == 1.0 and len(result["a"]["batch_seconds"]) == 4
    assert result["a"]["tokens"] == 0  # not a DecodeOutput: no tokens counted


def test_cycled_batches_cover_every_input_in_order():
    ids = [[1], [2], [3]]
    assert benchmark.cycled_batches(ids, 2) == [[[1], [2]], [[3], [1]]]
    assert benchmark.cycled_batches(ids, 4) == [[[1], [2], [3], [1]]]
    assert benchmark.cycled_batches(ids, 1) == [[[1]], [[2]], [[3]]]


def test_memory_estimate_scales_with_batch_and_cache():
    model = decoder.DecoderLM(
        decoder.DecoderConfig(
            vocab_size=1000,
            emb_dim=64,
            num_layers=3,
            num_heads=4,
            num_kv_heads=2,
            head_dim=16,
            mlp_dim=128,
        )
    )
    one = benchmark.estimated_bytes([model], 1, 100, 5)
    kv = 2 * 3 * 100 * 2 * 16 * 4  # k and v, layers, cache, kv heads, head dim, float32
    assert one == kv + 8 * 5 * 1000 * 4
    assert benchmark.estimated_bytes([model, model], 4, 100, 5) == 2 * 4 * kv + 4 * 8 * 5 * 1000 * 4
