"""Every gin model config under configs/models parses and builds its model (no weights)."""

from __future__ import annotations

import math
import pathlib

import gin
import jax
import pytest

from speculative.config import configurables
from speculative.models import t5
from tests.helpers import t5_1_1_small

ROOT = pathlib.Path(__file__).resolve().parents[1]
GIN_FILES = sorted((ROOT / "configs" / "models").rglob("*.gin"))

# (emb, heads, layers, head_dim, mlp) of the released checkpoints.
T5_DIMS = {
    "t5_1_1/small.gin": (512, 6, 8, 64, 1024),
    "t5_1_1/base.gin": (768, 12, 12, 64, 2048),
    "t5_1_1/large.gin": (1024, 16, 24, 64, 2816),
    "t5_1_1/xl.gin": (2048, 32, 24, 64, 5120),
    "t5_1_1/xxl.gin": (4096, 64, 24, 64, 10240),
    "t5_1_0/small.gin": (512, 8, 6, 64, 2048),
    "t5_1_0/base.gin": (768, 12, 12, 64, 3072),
    "t5_1_0/large.gin": (1024, 16, 24, 64, 4096),
    "t5_1_0/3B.gin": (1024, 32, 24, 128, 16384),
    "t5_1_0/11B.gin": (1024, 128, 24, 128, 65536),
}


def _build(path: pathlib.Path):
    gin.clear_config()
    try:
        return configurables.build_model([str(path)], search_path=str(ROOT))
    finally:
        gin.clear_config()


def test_all_t5_sizes_present():
    found = {str(p.relative_to(ROOT / "configs" / "models")) for p in GIN_FILES}
    assert set(T5_DIMS) <= found


@pytest.mark.parametrize("path", GIN_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_gin_file_builds_model(path):
    model = _build(path)
    assert hasattr(model, "config") and model.vocab_size > 0
    hash(model)  # models are static jit arguments
    name = str(path.relative_to(ROOT / "configs" / "models"))
    if name in T5_DIMS:
        cfg = model.config
        assert isinstance(model, t5.T5)
        got = (cfg.emb_dim, cfg.num_heads, cfg.num_encoder_layers, cfg.head_dim, cfg.mlp_dim)
        assert got == T5_DIMS[name]
        assert cfg.num_decoder_layers == cfg.num_encoder_layers and cfg.vocab_size == 32128
        v1_1 = name.startswith("t5_1_1")
        assert cfg.mlp_activations == (("gelu", "linear") if v1_1 else ("relu",))
        assert cfg.logits_via_embedding is not v1_1


@pytest.mark.parametrize(
    "name, count",
    [
        # Parameter counts of the released small checkpoints (HF t5-small, google/t5-v1_1-small).
        ("t5_1_0/small.gin", 60_506_624),
        ("t5_1_1/small.gin", 76_961_152),
    ],
)
def test_parameter_counts_match_released_checkpoints(name, count):
    model = _build(ROOT / "configs" / "models" / name)
    shapes = jax.eval_shape(model.init_params, jax.random.PRNGKey(0))
    assert sum(math.prod(x.shape) for x in jax.tree.leaves(shapes)) == count


def test_bindings_override_and_configs_compare_equal():
    gin.clear_config()
    try:
        model = configurables.build_model(
            [str(ROOT / "configs/models/t5_1_1/small.gin")],
            ["t5.T5Config.dtype = 'bfloat16'", "t5.T5Config.num_decoder_layers = 2"],
            search_path=str(ROOT),
        )
    finally:
        gin.clear_config()
    direct = t5_1_1_small(num_decoder_layers=2, dtype="bfloat16")
    assert model == direct and hash(model) == hash(direct)
