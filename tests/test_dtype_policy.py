"""One dtype knob (ModelSpec.dtype / DTYPE) for weights, activations and caches, with logits and
probabilities float32; and the bfloat16 divergence probe (scripts/bf16_divergence.py) on a toy
model."""

import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import pytest

from speculative import decoding
from speculative.loading import specs as model_loading
from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_model_spec_dtype_sets_weights_activations_and_cache(dtype):
    model = helpers.tiny_decoder_model(64, emb=32, layers=1, heads=2, kv_heads=1)
    loaded = model_loading.load_model(
        model_loading.ModelSpec(format="random", model=model, dtype=dtype), "target"
    )
    assert loaded.model.config.dtype == dtype
    assert {x.dtype for x in jax.tree.leaves(loaded.params)} == {jnp.dtype(dtype)}
    batch = helpers.ragged_prompts(0, batch=2, width=4, vocab=64)
    # jitted, as the decode loops run them: two programs instead of ~100 eagerly compiled ops
    state = jax.jit(lambda p, b: loaded.model.init_state(p, b, 16))(loaded.params, batch)
    assert state.cache["layers_0"]["key"].dtype == jnp.dtype(dtype)
    logits, _ = jax.jit(loaded.model.extend)(loaded.params, state, batch["prompt"])
    assert logits.dtype == jnp.float32
    out = decoding.speculative_decode(
        loaded.model, loaded.params, loaded.model, loaded.params, batch, gamma=2,
        max_decode_len=4, eos_id=63,
    )  # fmt: skip
    assert out.tokens.shape == (2, 4)


@pytest.mark.slow  # a measurement script's smoke run: scripts/test.sh --slow
def test_bf16_divergence_probe_runs_and_float32_never_diverges(tmp_path):
    spec = importlib.util.spec_from_file_location("bf16_div", ROOT / "scripts/bf16_divergence.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    report = probe.main(
        ["--tiny", "--prompts", "3", "--max_new_tokens", "6", "--gammas", "3",
         "--out", str(tmp_path)]
    )  # fmt: skip
    assert (tmp_path / "bf16_divergence.json").exists()
    for dtype in ("float32", "bfloat16"):
        r = report[dtype]["gamma_3"]
        assert r["prompts"] == 3 and len(r["first_difference"]) == 3
        assert 0.0 <= report[dtype]["block_logit_gap"][3] < 1.0
    # float32 block numerics stay within float32 rounding of one-at-a-time scoring
    assert report["float32"]["block_logit_gap"][3] < 1e-4
    assert report["float32"]["gamma_3"]["diverged"] == 0
