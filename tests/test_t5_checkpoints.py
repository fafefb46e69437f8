"""T5 checkpoint loaders: T5X (msgpack + zarr TensorStore) round trip, HF safetensors, clear errors."""

from __future__ import annotations

import dataclasses
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorstore as ts
from flax import serialization, traverse_util

from speculative.checkpoints import hf_t5, load_hf_t5, load_t5x, validation
from speculative.checkpoints import t5x as t5x_loader
from speculative.models import t5
from tests import helpers

CONFIG = helpers.tiny_t5_config(40, emb=16, heads=2, encoder_layers=2, decoder_layers=1, mlp=24)


@pytest.fixture(scope="module")
def params():
    return helpers.init_params(t5.T5(CONFIG), 0)  # one compiled init, not op by op eagerly


def write_t5x_checkpoint(directory, params, inline=("scale",), dtype=np.float32):
    """Writes params the way t5x/checkpoints.py does (format version 3).

    Each parameter goes to its own gzip-compressed zarr array `target.<dotted path>/`, referenced
    from the msgpack `checkpoint` by a TensorStore spec with a relative path; parameters whose name
    ends in one of `inline` are stored in the msgpack itself (as T5X does for unpartitioned ones).
    """
    os.makedirs(directory, exist_ok=True)
    tree = {}
    for path, value in traverse_util.flatten_dict(params, sep="/").items():
        value = np.asarray(value).astype(dtype)
        if path.endswith(inline):
            tree[path] = value
            continue
        relative = "target." + path.replace("/", ".")
        chunks = [max(1, d // 2) for d in value.shape]  # several chunks per array
        metadata = {
            "compressor": {"id": "gzip"},
            "shape": list(value.shape),
            "chunks": chunks,
            "dtype": "bfloat16" if value.dtype == jnp.bfloat16 else value.dtype.str,
        }
        spec = {
            "driver": "zarr",
            "kvstore": {"driver": "file", "path": relative},
            "metadata": metadata,
        }
        store = ts.open(
            {**spec, "kvstore": {"driver": "file", "path": os.path.join(directory, relative)}},
            create=True,
        ).result()
        store.write(value).result()
        tree[path] = spec
    state = {
        "version": 3,
        "optimizer": {
            "target": traverse_util.unflatten_dict(tree, sep="/"),
            "state": {"step": np.int32(100), "param_states": {}},
        },
    }
    with open(os.path.join(directory, "checkpoint"), "wb") as f:
        f.write(serialization.msgpack_serialize(state))


def _assert_same(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_t5x_round_trip(tmp_path, params):
    write_t5x_checkpoint(tmp_path / "checkpoint_100", params)
    assert (
        tmp_path / "checkpoint_100" / "target.encoder.layers_0.attention.query.kernel" / ".zarray"
    ).exists()
    loaded = load_t5x(str(tmp_path / "checkpoint_100"), CONFIG, dtype=jnp.float32)
    _assert_same(loaded, params)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(loaded))


def test_t5x_bfloat16_storage_and_cast(tmp_path, params):
    write_t5x_checkpoint(tmp_path, params, dtype=jnp.bfloat16)
    loaded = load_t5x(str(tmp_path), CONFIG, dtype=jnp.bfloat16)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(loaded))
    _assert_same(loaded, jax.tree.map(lambda x: x.astype(jnp.bfloat16), params))


def test_orbax_checkpoint_is_detected_and_read(tmp_path, params):
    ocp = pytest.importorskip("orbax.checkpoint")
    target = {"target": jax.tree.map(np.asarray, params), "state": {"step": np.int32(7)}}
    ocp.PyTreeCheckpointer().save(str(tmp_path / "orbax"), target)
    assert t5x_loader.is_orbax(str(tmp_path / "orbax"))
    _assert_same(load_t5x(str(tmp_path / "orbax"), CONFIG), params)


def test_t5x_shape_mismatch_names_parameter(tmp_path, params):
    write_t5x_checkpoint(tmp_path, params)
    wider = dataclasses.replace(CONFIG, mlp_dim=32)
    with pytest.raises(
        ValueError,
        match=r"'decoder/layers_0/mlp/wi_0/kernel' has shape \(16, 24\)"
        r", but the config expects \(16, 32\)",
    ):
        load_t5x(str(tmp_path), wider)


def test_t5x_missing_parameter(tmp_path, params):
    flat = traverse_util.flatten_dict(params, sep="/")
    del flat["encoder/layers_1/attention/value/kernel"]
    write_t5x_checkpoint(tmp_path, traverse_util.unflatten_dict(flat, sep="/"))
    with pytest.raises(ValueError, match="missing parameter 'encoder/layers_1/attention/value/"):
        load_t5x(str(tmp_path), CONFIG)


def test_t5x_extra_layer_is_unexpected(tmp_path, params):
    write_t5x_checkpoint(tmp_path, params)
    shallower = dataclasses.replace(CONFIG, num_encoder_layers=1)
    with pytest.raises(ValueError, match="unexpected parameter 'encoder/layers_1/"):
        load_t5x(str(tmp_path), shallower)


def test_t5x_truncated_zarr_chunk(tmp_path, params):
    write_t5x_checkpoint(tmp_path, params)
    chunk = tmp_path / "target.decoder.layers_0.self_attention.query.kernel" / "0.0"
    data = chunk.read_bytes()
    chunk.write_bytes(data[: len(data) // 2])
    with pytest.raises(
        ValueError, match="cannot read parameter 'decoder/layers_0/self_attention/query/kernel'"
    ):
        load_t5x(str(tmp_path), CONFIG)


QUERY_DIR = "target.decoder.layers_0.self_attention.query.kernel"
QUERY_NAME = "decoder/layers_0/self_attention/query/kernel"


def test_t5x_missing_chunk_is_refused_by_default(tmp_path, params):
    write_t5x_checkpoint(tmp_path, params)
    (tmp_path / QUERY_DIR / "1.0").unlink()  # one of the 2 x 2 chunks
    with pytest.raises(ValueError) as info:
        load_t5x(str(tmp_path), CONFIG)
    message = str(info.value)
    assert str(tmp_path) in message and repr(QUERY_NAME) in message
    assert "1 of its 4 chunk files are missing (grid positions (1, 0))" in message
    assert "allow_missing_chunks=True" in message
    # Opting in reads the chunk as the fill value (zeros), as zarr defines it.
    loaded = load_t5x(str(tmp_path), CONFIG, allow_missing_chunks=True)
    kernel = np.asarray(traverse_util.flatten_dict(loaded, sep="/")[QUERY_NAME])
    want = np.asarray(traverse_util.flatten_dict(params, sep="/")[QUERY_NAME])
    np.testing.assert_array_equal(kernel[8:, :8], 0)  # chunk (1, 0) of the 16 x 16 kernel
    np.testing.assert_array_equal(kernel[:8], want[:8])
    np.testing.assert_array_equal(kernel[8:, 8:], want[8:, 8:])


def test_t5x_all_chunks_missing(tmp_path, params):
    write_t5x_checkpoint(tmp_path, params)
    for chunk in (tmp_path / QUERY_DIR).iterdir():
        if chunk.name != ".zarray":
            chunk.unlink()
    with pytest.raises(
        ValueError,
        match=r"'decoder/layers_0/self_attention/query/kernel': 4 of its 4 chunk files are "
        r"missing \(grid positions \(0, 0\), \(0, 1\), \(1, 0\), \(1, 1\)\)",
    ):
        load_t5x(str(tmp_path), CONFIG)
    loaded = load_t5x(str(tmp_path), CONFIG, allow_missing_chunks=True)
    assert not np.any(np.asarray(traverse_util.flatten_dict(loaded, sep="/")[QUERY_NAME]))


def test_t5x_sharded_reader_refuses_missing_chunks(tmp_path, params):
    from speculative.checkpoints import sharded as sharded_checkpoints
    from speculative.parallel import partitioning

    write_t5x_checkpoint(tmp_path, params)
    (tmp_path / QUERY_DIR / "0.1").unlink()
    partitioner = partitioning.create_partitioner(1, 1)
    with pytest.raises(ValueError, match=r"query/kernel'.*grid positions \(0, 1\)"):
        sharded_checkpoints.load_t5x_sharded(str(tmp_path), CONFIG, partitioner)
    loaded = sharded_checkpoints.load_t5x_sharded(
        str(tmp_path), CONFIG, partitioner, allow_missing_chunks=True
    )
    kernel = np.asarray(traverse_util.flatten_dict(loaded, sep="/")[QUERY_NAME])
    np.testing.assert_array_equal(kernel[:8, 8:], 0)


def test_t5x_zarray_must_match_the_msgpack_spec(tmp_path, params):
    """A .zarray whose dtype disagrees with the msgpack's spec is refused, not reinterpreted."""
    write_t5x_checkpoint(tmp_path, params)
    zarray = tmp_path / QUERY_DIR / ".zarray"
    zarray.write_text(zarray.read_text().replace('"<f4"', '">f4"'))
    with pytest.raises(ValueError, match=f"{tmp_path}: cannot open parameter '{QUERY_NAME}'"):
        load_t5x(str(tmp_path), CONFIG)


def test_t5x_huge_declared_shape_is_refused_before_reading(tmp_path, params):
    write_t5x_checkpoint(tmp_path, params)
    # The msgpack spec and the .zarray agree on a 2**40-row kernel: refused before any read.
    state = serialization.msgpack_restore((tmp_path / "checkpoint").read_bytes())
    spec = state["optimizer"]["target"]["decoder"]["layers_0"]["self_attention"]["query"]
    spec["kernel"]["metadata"]["shape"] = [2**40, 16]
    (tmp_path / "checkpoint").write_bytes(serialization.msgpack_serialize(state))
    zarray = tmp_path / QUERY_DIR / ".zarray"
    meta = json.loads(zarray.read_text())
    meta["shape"] = [2**40, 16]
    zarray.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"query/kernel' has shape \(1099511627776, 16\)"):
        load_t5x(str(tmp_path), CONFIG)


def test_t5x_huge_chunk_shape_is_refused_before_reading(tmp_path, params):
    """Found by the fuzzer: TensorStore allocates a whole chunk per read and aborted the process."""
    write_t5x_checkpoint(tmp_path, params)
    zarray = tmp_path / QUERY_DIR / ".zarray"
    meta = json.loads(zarray.read_text())
    meta["chunks"] = [2**40, 8]
    zarray.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"query/kernel' has chunks of shape \(1099511627776, 8\)"):
        load_t5x(str(tmp_path), CONFIG)


def test_t5x_not_a_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="no T5X 'checkpoint'"):
        load_t5x(str(tmp_path), CONFIG)


# ------------------------------------------------------------------------------------------------
# Hugging Face directories. Logit equivalence with transformers is in test_t5_model.py; these
# check the file handling and errors, on files written with safetensors' own writer.


def write_hf(directory, params, config=CONFIG, drop=(), extra=None):
    """Writes params in HF's naming and layout (torch Linear weights are [out, in])."""
    from safetensors.numpy import save_file

    flat = traverse_util.flatten_dict(params, sep="/")
    tensors = {}
    for ours, (theirs, transpose) in hf_t5.name_map(config).items():
        value = np.asarray(flat[ours])
        tensors[theirs] = np.ascontiguousarray(value.T if transpose else value)
    tensors["lm_head.weight"] = np.ascontiguousarray(
        np.asarray(flat["decoder/logits_dense/kernel"]).T
    )
    for name in drop:
        del tensors[name]
    tensors.update(extra or {})
    os.makedirs(directory, exist_ok=True)
    save_file(tensors, os.path.join(directory, "model.safetensors"))
    hf_config = {
        "model_type": "t5",
        "vocab_size": config.vocab_size,
        "d_model": config.emb_dim,
        "d_kv": config.head_dim,
        "d_ff": config.mlp_dim,
        "num_layers": config.num_encoder_layers,
        "num_decoder_layers": config.num_decoder_layers,
        "num_heads": config.num_heads,
        "feed_forward_proj": "gated-gelu",
        "tie_word_embeddings": False,
    }
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(hf_config, f)


def test_hf_round_trip_and_bfloat16(tmp_path, params):
    write_hf(tmp_path, params)
    config, loaded = load_hf_t5(str(tmp_path))
    assert config == CONFIG
    _assert_same(loaded, params)
    config16, loaded16 = load_hf_t5(str(tmp_path), dtype=jnp.bfloat16)
    assert config16.dtype == "bfloat16"
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(loaded16))


def test_hf_missing_tensor_names_both_names(tmp_path, params):
    write_hf(tmp_path, params, drop=["decoder.block.0.layer.1.EncDecAttention.k.weight"])
    with pytest.raises(
        ValueError,
        match=r"missing parameter 'decoder/layers_0/"
        r"encoder_decoder_attention/key/kernel' \(stored as "
        r"'decoder.block.0.layer.1.EncDecAttention.k.weight'\)",
    ):
        load_hf_t5(str(tmp_path))


def test_hf_shape_mismatch(tmp_path, params):
    bad = {"encoder.block.1.layer.1.DenseReluDense.wo.weight": np.zeros((16, 20), np.float32)}
    write_hf(tmp_path, params, extra=bad)
    with pytest.raises(
        ValueError,
        match=r"'encoder/layers_1/mlp/wo/kernel' \(stored as .*\) has "
        r"shape \(20, 16\), but the config expects \(24, 16\)",
    ):
        load_hf_t5(str(tmp_path))


def test_hf_unexpected_tensor(tmp_path, params):
    write_hf(tmp_path, params, extra={"encoder.block.5.layer.0.layer_norm.weight": np.ones(16)})
    with pytest.raises(ValueError, match="unexpected tensor 'encoder.block.5.layer.0.layer_norm"):
        load_hf_t5(str(tmp_path))


def test_hf_truncated_safetensors(tmp_path, params):
    write_hf(tmp_path, params)
    path = tmp_path / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    with pytest.raises(ValueError, match="truncated safetensors file: tensor '.*' needs bytes"):
        load_hf_t5(str(tmp_path))
    path.write_bytes(data[:20])
    with pytest.raises(ValueError, match="truncated safetensors file: header needs"):
        load_hf_t5(str(tmp_path))


def rewrite_header(path, edit):
    """Rewrites a safetensors file's JSON header with edit(header) -> header; the data stays."""
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.dumps(edit(json.loads(data[8 : 8 + size]))).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + data[8 + size :])


def test_hf_overlapping_offsets_are_refused(tmp_path, params):
    """The decoder norm pointed at the encoder norm's bytes used to load them silently."""
    write_hf(tmp_path, params)

    def alias(header):
        encoder = header["encoder.final_layer_norm.weight"]["data_offsets"]
        header["decoder.final_layer_norm.weight"]["data_offsets"] = encoder
        return header

    rewrite_header(tmp_path / "model.safetensors", alias)
    with pytest.raises(ValueError) as info:
        load_hf_t5(str(tmp_path))
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'model.safetensors'}: corrupt safetensors file")
    assert "overlap" in message
    assert "'decoder.final_layer_norm.weight'" in message
    assert "'encoder.final_layer_norm.weight'" in message


@pytest.mark.parametrize(
    "edit, problem",
    [
        (lambda h: list(h), "header is a JSON list, not an object"),
        (lambda h: 7, "header is a JSON int, not an object"),
        (
            lambda h: {**h, "shared.weight": {**h["shared.weight"], "data_offsets": [-4, 0]}},
            r"tensor 'shared.weight': data_offsets \[-4, 0\] are not",
        ),
        (
            lambda h: {**h, "shared.weight": {**h["shared.weight"], "shape": [40, 17]}},
            r"tensor 'shared.weight' has 2560 bytes for shape \(40, 17\) F32 \(2720 bytes\)",
        ),
        (
            lambda h: {**h, "shared.weight": {**h["shared.weight"], "dtype": "Q4"}},
            r"tensor 'shared.weight': unsupported dtype 'Q4'",
        ),
    ],
    ids=["list", "int", "negative-offset", "wrong-size", "unknown-dtype"],
)
def test_hf_corrupt_header_names_file_and_tensor(tmp_path, params, edit, problem):
    write_hf(tmp_path, params)
    rewrite_header(tmp_path / "model.safetensors", edit)
    with pytest.raises(ValueError, match=f"^{re.escape(str(tmp_path))}.*{problem}"):
        load_hf_t5(str(tmp_path))


@pytest.mark.parametrize(
    "text, problem",
    [
        ('{"vocab_size": 40,', "config is not valid JSON"),
        ("{}", "config has no 'vocab_size'"),
        ("[1, 2]", "config is a JSON list, not an object"),
        ('{"vocab_size": "40"}', "config 'vocab_size' is '40', not a positive integer"),
        ('{"vocab_size": 40, "d_model": "16"}', "config 'd_model' is '16', not a positive"),
        ('{"vocab_size": 40, "num_layers": 0}', "config 'num_layers' is 0, not a positive"),
        ('{"vocab_size": 40, "layer_norm_epsilon": "x"}', "'layer_norm_epsilon' is 'x'"),
        ('{"vocab_size": 40, "feed_forward_proj": 3}', "'feed_forward_proj' is 3, not a string"),
        ('{"vocab_size": 40, "model_type": "bert"}', "not a T5 config: model_type 'bert'"),
        (b"\xff\xfe{}", "config is not valid JSON"),
    ],
    ids=[
        "invalid-json",
        "empty",
        "list",
        "string-vocab",
        "string-d_model",
        "zero-layers",
        "string-eps",
        "int-proj",
        "bert",
        "not-utf8",
    ],
)
def test_hf_bad_config_json_is_a_one_line_error(tmp_path, params, text, problem):
    write_hf(tmp_path, params)
    config = tmp_path / "config.json"
    if isinstance(text, bytes):
        config.write_bytes(text)
    else:
        config.write_text(text)
    with pytest.raises(ValueError) as info:
        load_hf_t5(str(tmp_path))
    message = str(info.value)
    assert message.startswith(f"{config}: ") and problem in message
    assert "\n" not in message


def test_hf_config_with_more_layers_than_weights(tmp_path, params):
    """A corrupt layer count is refused before the model's shapes are built."""
    write_hf(tmp_path, params)
    config = tmp_path / "config.json"
    config.write_text(config.read_text().replace('"num_layers": 2', '"num_layers": 1000000000'))
    with pytest.raises(ValueError, match="num_layers says 1000000000 encoder layers, but the"):
        load_hf_t5(str(tmp_path))


def test_hf_corrupt_index(tmp_path, params):
    write_hf(tmp_path, params)
    index = tmp_path / "model.safetensors.index.json"
    index.write_text('{"weight_map": ')
    with pytest.raises(ValueError, match=f"{re.escape(str(index))}: safetensors index is not"):
        load_hf_t5(str(tmp_path))
    index.write_text('{"weight_map": {"shared.weight": "../model.safetensors"}}')
    with pytest.raises(ValueError, match="shard '../model.safetensors' is outside"):
        load_hf_t5(str(tmp_path))


def test_hf_nan_weights_are_refused(tmp_path, params):
    bad = np.full((16,), np.nan, np.float32)
    write_hf(tmp_path, params, extra={"decoder.final_layer_norm.weight": bad})
    with pytest.raises(ValueError, match="'decoder/decoder_norm/scale'.*NaN"):
        load_hf_t5(str(tmp_path))


def test_validation_is_generic():
    expected = {"a": {"b": jax.ShapeDtypeStruct((2, 3), jnp.float32)}}
    tree = validation.to_params({"a/b": np.ones((2, 3))}, expected, jnp.bfloat16, "x.bin")
    assert tree["a"]["b"].dtype == jnp.bfloat16
    with pytest.raises(ValueError, match=r"x.bin: parameter 'a/b' has shape \(3, 2\)"):
        validation.to_params({"a/b": np.ones((3, 2))}, expected, jnp.float32, "x.bin")
    with pytest.raises(ValueError, match="non-float dtype int32"):
        validation.to_params({"a/b": np.ones((2, 3), np.int32)}, expected, jnp.float32, "x.bin")
