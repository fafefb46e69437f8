"""The inference job on ('data', 'model') meshes of 8 host devices, through its command line.

Greedy tokens and the summary's alpha and tau on a 2x4 and a 4x2 mesh equal the unsharded run's;
a BATCH_SIZE the 'data' axis does not divide is a one-line error (exit 2) before anything loads.
Needs XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts, so the default suite runs
this module in a subprocess (tests/test_job_spmd.py); by hand:
    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/pytest tests/test_job_meshes.py
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import jax
import pytest

from speculative import benchmark, infer
from speculative.checkpoints import sharded as sharded_checkpoints
from speculative.checkpoints import t5x
from speculative.config import gin_flags
from speculative.jobs import spmd as job_spmd
from speculative.models import t5
from speculative.parallel import partitioning
from tests import helpers

pytestmark = helpers.needs_host_devices("tests/test_job_spmd.py")

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = helpers.TINY_INFER
PROMPTS = ["Hi", "Ein", "x = 1", "def add(a, b):", "Hello, world!", "import numpy", "a", "bc"]
MESHES = [(2, 4), (4, 2)]


def _flags(inputs: pathlib.Path, out: pathlib.Path, *extra: str) -> list[str]:
    return TINY + [
        "--gin.speculative.InferConfig.measure_c=False",
        "--gin.speculative.InferConfig.progress=False",
        "--gin.COMPILATION_CACHE_DIR=None",
        f"--gin.INPUT_FILE='{inputs}'",
        f"--gin.OUTPUT_DIR='{out}'",
        *extra,
    ]


def _mesh(data: int, model: int) -> list[str]:
    return [
        "--gin.PARTITIONER=@partitioning.create_partitioner()",
        f"--gin.partitioning.create_partitioner.data={data}",
        f"--gin.partitioning.create_partitioner.model={model}",
    ]


def _rows(out: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]


@pytest.fixture(autouse=True)
def _cwd_repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("inputs") / "in.jsonl"
    path.write_text("".join(json.dumps({"inputs": t}) + "\n" for t in PROMPTS))
    return path


@pytest.mark.parametrize(  # 4x2 repeats 2x4 with the axes' sizes swapped
    "data, model", [MESHES[0], pytest.param(*MESHES[1], marks=pytest.mark.slow)]
)
def test_meshes_give_the_unsharded_tokens_alpha_and_tau(inputs, tmp_path, data, model):
    batch = "--gin.BATCH_SIZE=4"
    reference = infer.main(_flags(inputs, tmp_path / "unsharded", batch))
    assert "partitioner" not in reference
    expected = [r["output_ids"] for r in _rows(tmp_path / "unsharded")]
    out = tmp_path / f"mesh_{data}x{model}"
    summary = infer.main(_flags(inputs, out, batch, *_mesh(data, model)))
    assert summary["partitioner"]["mesh"] == {"data": data, "model": model}
    assert [r["output_ids"] for r in _rows(out)] == expected, (data, model)
    assert summary["alpha"] == reference["alpha"] and summary["tau"] == reference["tau"]
    assert summary["tokens"] == reference["tokens"]


def test_batch_size_the_data_axis_does_not_divide_fails_before_loading(inputs, tmp_path, capsys):
    out = tmp_path / "bad"
    code = gin_flags.run_job(infer.main, _flags(inputs, out, "--gin.BATCH_SIZE=3", *_mesh(2, 4)))
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err.strip() == (
        "error: BATCH_SIZE 3 is not divisible by the 'data' mesh axis of size 2"
    )
    assert "target:" not in captured.out + captured.err and not out.exists()  # nothing loaded


def test_a_mesh_that_does_not_divide_the_model_is_a_one_line_error(inputs, tmp_path, capsys):
    # num_heads = 4 of the tiny target cannot split over model = 8.
    flags = _flags(inputs, tmp_path / "o", "--gin.BATCH_SIZE=1", *_mesh(1, 8))
    assert gin_flags.run_job(infer.main, flags) == 2
    err = helpers.without_log_lines(capsys.readouterr().err).strip()
    assert err.startswith("error: target: mesh: DecoderLM: ") and "\n" not in err
    assert "is not divisible by the 'model' mesh axis of size 8" in err


T5_GIN = """
TARGET_FORMAT = 't5x'
TARGET_CHECKPOINT = '{path}'
TARGET_MODEL = @target/t5.T5()
target/t5.T5.config = @target/t5.T5Config()
target/t5.T5Config:
  vocab_size = 264
  emb_dim = 32
  num_heads = 4
  num_encoder_layers = 1
  num_decoder_layers = 1
  head_dim = 8
  mlp_dim = 64
  mlp_activations = ('gelu', 'linear')
  logits_via_embedding = False
"""


def test_t5x_target_is_read_per_shard_with_the_unsharded_tokens(inputs, tmp_path, monkeypatch):
    from tests.test_t5_checkpoints import write_t5x_checkpoint

    config = helpers.tiny_t5_config(264, emb=32, heads=4, encoder_layers=1, decoder_layers=1)
    model = t5.T5(dataclasses.replace(config, mlp_dim=64))  # as T5_GIN binds it
    write_t5x_checkpoint(str(tmp_path / "ckpt"), jax.jit(model.init_params)(jax.random.PRNGKey(3)))
    models = tmp_path / "t5.gin"
    models.write_text(T5_GIN.format(path=tmp_path / "ckpt"))
    common = ["--gin.BATCH_SIZE=4", f"--gin_file={models}", "--gin.SPECULATIVE=False"]
    infer.main(_flags(inputs, tmp_path / "whole", *common))
    reads = []
    original = sharded_checkpoints.read_slice

    def recording_read(source, index, version):
        out = original(source, index, version)
        reads.append(out.size)
        return out

    def never_whole(*args, **kwargs):
        raise AssertionError("a T5X checkpoint was loaded whole on a mesh")

    monkeypatch.setattr(sharded_checkpoints, "read_slice", recording_read)
    monkeypatch.setattr(t5x, "load_t5x", never_whole)  # format 't5x''s whole read (t5x.read_t5x)
    infer.main(_flags(inputs, tmp_path / "sharded", *common, *_mesh(2, 4)))
    assert 264 * 32 // 4 in reads and 264 * 32 not in reads  # the embedding, a quarter at a time
    whole, sharded = _rows(tmp_path / "whole"), _rows(tmp_path / "sharded")
    assert [r["output_ids"] for r in sharded] == [r["output_ids"] for r in whole]


def test_benchmark_on_a_mesh_matches_plain_greedy(inputs, tmp_path):
    flags = [
        "--gin_file=configs/runs/benchmark.gin",
        "--gin_file=configs/demo/tiny_random_models.gin",
        f"--gin.INPUT_FILE='{inputs}'",
        f"--gin.OUTPUT_DIR='{tmp_path / 'bench'}'",
        "--gin.GAMMAS=[2]",
        "--gin.TEMPERATURES=[0.0]",
        "--gin.BATCH_SIZES=[4]",
        "--gin.REPEATS=1",
        "--gin.NUM_EXAMPLES=4",
        "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 8}",
        "--gin.COMPILATION_CACHE_DIR=None",
        *_mesh(2, 4),
    ]
    result = benchmark.main(flags)
    assert result["partitioner"]["mesh"] == {"data": 2, "model": 4}
    assert result["cells"][0]["points"][0]["greedy_identical_to_plain"]
    code = gin_flags.run_job(benchmark.main, flags + ["--gin.BATCH_SIZES=[4, 3]"])
    assert code == 2  # 3 rows do not split over data = 2: refused before the sweep


def test_hosts_rows_of_a_real_mesh_cover_the_batch_once():
    """Pretend each data row of a 4x2 mesh is one host: the hosts' rows tile the batch."""
    partitioner = partitioning.create_partitioner(data=4, model=2)
    host_of = {d: i for i, row in enumerate(partitioner.mesh.devices) for d in row}
    indices = partitioner.row_sharding(1).devices_indices_map((8,))
    spans = [job_spmd.rows_of_process(indices, host_of.get, h, 8) for h in range(4)]
    assert sorted((s.start, s.stop) for s in spans) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert job_spmd.local_rows(partitioner, 8) == slice(0, 8)  # one real process: every row
