"""GGUF (llama.cpp) checkpoints -> the parameters of the model family registered for the file's
`general.architecture` (`checkpoints.families`: its `gguf_config` and `gguf_tensor_map`); the LLaMA
layout ('decoder' family: `llama`, `qwen2`) is translated here (`decoder_config`, `tensor_map`).

GGUF stores each tensor with its dimensions in ggml order (innermost first); `gguf.GGUFReader`
already reverses them, so a linear weight reads as the PyTorch-layout `[out, in]` matrix of the
Hugging Face checkpoint it was converted from. For `llama` (not `qwen2`) llama.cpp's converter also
permutes the rows of the Q and K projections inside every head, from the rotate-half RoPE layout to
ggml's interleaved pairs; `_unpermute_rows` undoes that, since DecoderLM uses rotate-half.

Tensors are dequantised one at a time with `gguf.quants.dequantize` (float32), rearranged into the
DecoderLM tree (see speculative/models/decoder.py) and cast to the requested dtype, so the peak host
memory is the final parameters plus a few copies of the largest tensor.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from typing import Any

import gguf
import jax
import jax.numpy as jnp
import numpy as np

from speculative.checkpoints import families, validation
from speculative.checkpoints.gguf_io import metadata_value, open_gguf, reader_path
from speculative.models.decoder import DecoderConfig

# The architectures of the LLaMA layout ('decoder' family); families.gguf_architectures() has all.
SUPPORTED_ARCHITECTURES = ("llama", "qwen2")

# Quantisation types the loader accepts (all that the files of speculative/loading/fetch.py use,
# plus the other plain types gguf-py can dequantise).
_TYPE_NAMES = "F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K"
SUPPORTED_TYPES = frozenset(gguf.GGMLQuantizationType[name] for name in _TYPE_NAMES.split())


def family_of(reader: gguf.GGUFReader) -> families.Family:
    """The family registered for the file's `general.architecture`; ValueError naming it and the
    supported ones otherwise."""
    arch = metadata_value(reader, "general.architecture", required=True)
    family = families.of_gguf_architecture(arch)
    if family is None:
        raise ValueError(
            f"unsupported GGUF architecture {arch!r}; "
            f"supported: {', '.join(families.gguf_architectures())}"
        )
    return family


def config_from_metadata(
    reader: gguf.GGUFReader, tensors: dict[str, gguf.ReaderTensor], dtype=jnp.float32
) -> Any:
    """The config (DecoderConfig for llama / qwen2) from the `{arch}.*` hyper-parameters and the
    tensors present, by the architecture's family.

    Raises ValueError naming the file for an unsupported architecture or variant, or a missing or
    malformed hyper-parameter (e.g. a layer count larger than the file's layers).
    """
    source = reader_path(reader)
    try:
        return family_of(reader).gguf_config(reader, tensors, dtype)
    except ValueError as e:
        message = str(e)
        raise ValueError(message if message.startswith(source) else f"{source}: {message}") from e


def _number(reader: gguf.GGUFReader, key: str, kind: type, default: Any = None) -> Any:
    """A finite, positive int or float metadata value (required when default is None)."""
    value = metadata_value(reader, key, default, required=default is None)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"GGUF metadata key {key!r} is {value!r}, not a number")
    if not (math.isfinite(value) and value > 0) or (kind is int and value != int(value)):
        raise ValueError(f"GGUF metadata key {key!r} is {value!r}, not a positive {kind.__name__}")
    return kind(value)


def _layer_count(tensors: dict[str, gguf.ReaderTensor]) -> int:
    """1 + the highest `blk.N.` index among the tensors (0 without any)."""
    blocks = [int(m.group(1)) for name in tensors if (m := re.match(r"blk\.(\d+)\.", name))]
    return max(blocks) + 1 if blocks else 0


def decoder_config(
    reader: gguf.GGUFReader, tensors: dict[str, gguf.ReaderTensor], dtype: Any
) -> DecoderConfig:
    """The 'decoder' family's translation: a DecoderConfig of a llama / qwen2 file."""
    arch = metadata_value(reader, "general.architecture", required=True)

    def get(key, default=None):
        return metadata_value(reader, f"{arch}.{key}", default, required=default is None)

    def size(key, default=None):
        return _number(reader, f"{arch}.{key}", int, default)

    scaling = get("rope.scaling.type", "none")
    if scaling not in ("none", "") and not (
        scaling == "linear" and _number(reader, f"{arch}.rope.scaling.factor", float, 1.0) == 1.0
    ):
        raise ValueError(f"RoPE scaling {scaling!r} is not supported by DecoderLM")
    if "rope_freqs.weight" in tensors:
        raise ValueError("per-frequency RoPE factors (rope_freqs.weight) are not supported")

    emb_dim, num_heads = size("embedding_length"), size("attention.head_count")
    head_dim = size("attention.key_length", max(emb_dim // num_heads, 1))
    if size("attention.value_length", head_dim) != head_dim:
        raise ValueError("attention.value_length != key_length is not supported")
    rope_dims = size("rope.dimension_count", head_dim)
    if rope_dims != head_dim:
        raise ValueError(f"partial RoPE ({rope_dims} of {head_dim} dims) is not supported")
    if "token_embd.weight" not in tensors:
        raise ValueError("GGUF tensor 'token_embd.weight' is missing")
    # Checked before the model's shapes are built: a corrupt count must not build a huge model.
    num_layers = size("block_count")
    if num_layers > _layer_count(tensors):
        raise ValueError(
            f"{arch}.block_count is {num_layers}, but the file has tensors for "
            f"{_layer_count(tensors)} layers"
        )
    vocab_size = int(tensors["token_embd.weight"].shape[-1])  # ggml order: [E, V]
    return DecoderConfig(
        vocab_size=vocab_size,
        emb_dim=emb_dim,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=size("attention.head_count_kv", num_heads),
        head_dim=head_dim,
        mlp_dim=size("feed_forward_length"),
        rope_theta=_number(reader, f"{arch}.rope.freq_base", float, 10000.0),
        norm_eps=_number(reader, f"{arch}.attention.layer_norm_rms_epsilon", float),
        qkv_bias="blk.0.attn_q.bias" in tensors,
        tie_word_embeddings="output.weight" not in tensors,
        max_seq_len=size("context_length"),
        dtype=jnp.dtype(dtype).name,
    )


def _unpermute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """Undoes llama.cpp's Q/K permutation: per head, rows [x0 y0 x1 y1 ..] -> [x0 x1 .. y0 y1 ..].

    w: [heads * D, ...] (a weight [heads * D, E] or a bias [heads * D]).
    """
    d = w.shape[0] // heads
    return w.reshape(heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


Transform = Callable[[np.ndarray], np.ndarray]


def tensor_map(config: DecoderConfig, arch: str) -> dict[tuple[str, ...], tuple[str, Transform]]:
    """DecoderLM parameter path -> (GGUF tensor name, transform of its [out, in] array)."""
    h, k, d, e = config.num_heads, config.num_kv_heads, config.head_dim, config.emb_dim

    # GGUF (like PyTorch) stores weights [out, in], which is DecoderLM's output-major layout.
    def qk(heads: int) -> Transform:  # [heads*D, E] -> [heads, D, E]
        fix = (lambda w: _unpermute_rows(w, heads)) if arch == "llama" else (lambda w: w)
        return lambda w: fix(w).reshape(heads, d, e)

    def qk_bias(heads: int) -> Transform:
        fix = (lambda b: _unpermute_rows(b, heads)) if arch == "llama" else (lambda b: b)
        return lambda b: fix(b).reshape(heads, d)

    same = lambda w: w  # noqa: E731
    out = {
        ("token_embedder", "embedding"): ("token_embd.weight", same),  # [V, E]
        ("decoder_norm", "scale"): ("output_norm.weight", same),
    }
    if not config.tie_word_embeddings:
        out[("logits_dense", "kernel")] = ("output.weight", same)  # [V, E]
    for i in range(config.num_layers):
        layer, blk = f"layers_{i}", f"blk.{i}"
        attn = (layer, "self_attention")
        out[(layer, "pre_self_attention_layer_norm", "scale")] = (f"{blk}.attn_norm.weight", same)
        out[(*attn, "query", "kernel")] = (f"{blk}.attn_q.weight", qk(h))
        out[(*attn, "key", "kernel")] = (f"{blk}.attn_k.weight", qk(k))
        out[(*attn, "value", "kernel")] = (
            f"{blk}.attn_v.weight",
            lambda w, k=k: w.reshape(k, d, e),
        )
        if config.qkv_bias:
            out[(*attn, "query", "bias")] = (f"{blk}.attn_q.bias", qk_bias(h))
            out[(*attn, "key", "bias")] = (f"{blk}.attn_k.bias", qk_bias(k))
            out[(*attn, "value", "bias")] = (f"{blk}.attn_v.bias", lambda b, k=k: b.reshape(k, d))
        out[(*attn, "out", "kernel")] = (
            f"{blk}.attn_output.weight",
            lambda w: w.reshape(e, h, d),  # [E, H*D] -> [E, H, D]
        )
        out[(layer, "pre_mlp_layer_norm", "scale")] = (f"{blk}.ffn_norm.weight", same)
        out[(layer, "mlp", "wi_0", "kernel")] = (f"{blk}.ffn_gate.weight", same)  # [M, E]
        out[(layer, "mlp", "wi_1", "kernel")] = (f"{blk}.ffn_up.weight", same)
        out[(layer, "mlp", "wo", "kernel")] = (f"{blk}.ffn_down.weight", same)  # [E, M]
    return out


def dequantize(tensor: gguf.ReaderTensor, source: str = "GGUF file") -> np.ndarray:
    """float32 array of a GGUF tensor, in the reader's (PyTorch-like, [out, in]) dimension order."""
    if tensor.tensor_type not in SUPPORTED_TYPES:
        raise ValueError(
            f"{source}: GGUF tensor {tensor.name!r} has unsupported type {tensor.tensor_type.name}"
        )
    try:
        array = np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), np.float32)
        if np.shares_memory(array, tensor.data):  # F32 comes back as a view of the mapped file
            array = array.copy()
        expected = tuple(int(n) for n in reversed(tensor.shape.tolist()))
        return array.reshape(expected)
    except (ValueError, IndexError, TypeError) as e:  # block data that does not fit its shape
        raise ValueError(
            f"{source}: GGUF tensor {tensor.name!r} ({tensor.tensor_type.name}, shape "
            f"{tuple(tensor.shape.tolist())}) cannot be dequantised: {e}"
        ) from e


def load_gguf(path: str | os.PathLike, dtype=jnp.float32) -> tuple[Any, dict]:
    """Reads a GGUF file of an architecture some family reads (llama, qwen2: the 'decoder' one).

    Returns:
      (config, params): the family's config from the file's metadata (DecoderConfig for llama /
      qwen2; config.dtype = dtype) and its parameter tree (nested dicts of jax arrays of `dtype`);
      `families.build(config)` gives the model.
    Raises:
      ValueError: the file is missing, truncated or corrupt; the architecture, a tensor type or a
        RoPE variant is unsupported; a tensor is missing, unexpected, mis-shaped or not finite.
    """
    source = os.fspath(path)
    reader = open_gguf(path)
    tensors = {t.name: t for t in reader.tensors}
    config = config_from_metadata(reader, tensors, dtype)
    arch = metadata_value(reader, "general.architecture")
    mapping = {
        validation.SEP.join(p): v
        for p, v in family_of(reader).gguf_tensor_map(config, arch).items()
    }
    expected = validation.expected_shapes(
        jax.eval_shape(families.build(config).init_params, jax.random.PRNGKey(0))
    )
    if set(mapping) != set(expected):  # a bug in the family's tensor map, not in the file
        raise AssertionError(f"tensor map and model tree differ: {set(mapping) ^ set(expected)}")
    missing = sorted(name for name, _ in mapping.values() if name not in tensors)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"{source}: GGUF tensor {missing[0]!r} is missing{more}")
    unused = sorted(set(tensors) - {name for name, _ in mapping.values()})
    if unused:
        raise ValueError(
            f"{source}: unexpected GGUF tensor {unused[0]!r} for a {arch} model with this config"
        )

    flat = {}
    for path_str, (name, transform) in mapping.items():
        array = dequantize(tensors[name], source)
        try:
            value = transform(array)
        except ValueError:  # numpy cannot reshape it: the metadata and the tensor disagree
            raise ValueError(
                f"{source}: GGUF tensor {name!r} of shape {array.shape} does not fit parameter "
                f"{path_str!r} of shape {expected[path_str]} (check the head counts in the metadata)"
            ) from None
        del array
        # One tensor at a time: check its shape, cast it, and let the float32 copy go, so the
        # peak is the final parameters plus a few copies of the largest tensor.
        validation.validate(
            {path_str: value}, {path_str: expected[path_str]}, source, {path_str: name}
        )
        flat[path_str] = validation.cast(value, dtype, path_str, source)
        del value
    return config, validation.unflatten(flat)


read_gguf = families.config_reader(load_gguf)  # format 'gguf' (`families.reader`)
