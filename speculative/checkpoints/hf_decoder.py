"""Hugging Face decoder-only checkpoints (config.json + model.safetensors or a sharded
model.safetensors.index.json) -> the parameters of the model family registered for the config's
model_type (`checkpoints.families`): Llama / Qwen2 / Mistral -> models.decoder.DecoderLM (this
file), Gemma 2 / Gemma 3 text -> models.gemma.GemmaLM (checkpoints.hf_gemma). Never pickle: a
directory with only pytorch_model.bin (or other *.bin / *.pt files) is refused.

Name and layout mapping (E = hidden_size, H / K = query / key-value heads, D = head_dim):
    model.embed_tokens.weight [V, E]                 -> token_embedder/embedding [V, E]
    model.layers.{i}.input_layernorm.weight [E]      -> layers_{i}/pre_self_attention_layer_norm/scale
    model.layers.{i}.self_attn.q_proj.weight [H*D, E] -> .../query/kernel [H, D, E] (bias [H, D])
    model.layers.{i}.self_attn.{k,v}_proj.weight [K*D, E] -> .../{key,value}/kernel [K, D, E]
    model.layers.{i}.self_attn.o_proj.weight [E, H*D] -> .../out/kernel [E, H, D]
    model.layers.{i}.post_attention_layernorm.weight -> layers_{i}/pre_mlp_layer_norm/scale
    model.layers.{i}.mlp.{gate,up,down}_proj.weight  -> layers_{i}/mlp/{wi_0,wi_1,wo}/kernel
    model.norm.weight [E]                            -> decoder_norm/scale
    lm_head.weight [V, E]                            -> logits_dense/kernel (untied heads only)

HF stores Q and K rows in the rotate-half RoPE layout DecoderLM uses, so nothing is permuted (GGUF
files of llama permute them; checkpoints.gguf undoes that). Every tensor's name, shape and dtype
(F32, F16 or BF16) is checked against the config from the file headers before any is read; then
tensors are read one at a time and cast to the requested dtype.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401 (registers the bfloat16 dtype that safetensors asks numpy for)
import numpy as np
import safetensors

from speculative.checkpoints import families, gguf, hf_config, hf_t5, validation
from speculative.models import rope
from speculative.models.decoder import DecoderConfig, DecoderLM

log = logging.getLogger(__name__)

FLOAT_DTYPES = ("F32", "F16", "BF16")
_PICKLED = ("*.bin", "*.pt", "*.pth", "*.ckpt")

Transform = Callable[[np.ndarray], np.ndarray]


def _shard_files(directory: str) -> list[str]:
    """The safetensors files of a directory (one, or the shards its index names)."""
    index_path = os.path.join(directory, "model.safetensors.index.json")
    single = os.path.join(directory, "model.safetensors")
    if os.path.isfile(index_path):
        shards = sorted(set(hf_t5.shard_paths(directory, index_path).values()))
        for shard in shards:
            if not os.path.isfile(os.path.join(directory, shard)):
                raise FileNotFoundError(f"{index_path}: shard {shard!r} does not exist")
        return [os.path.join(directory, shard) for shard in shards]
    if os.path.isfile(single):
        return [single]
    pickled = sorted(
        os.path.basename(p)
        for pattern in _PICKLED
        for p in glob.glob(os.path.join(directory, pattern))
    )
    if pickled:
        raise ValueError(
            f"{directory}: only pickled weights ({pickled[0]}); pickle is never loaded: save the "
            "model with safetensors (save_pretrained(..., safe_serialization=True))"
        )
    raise FileNotFoundError(f"{directory}: no model.safetensors or model.safetensors.index.json")


def read_headers(directory: str) -> dict[str, tuple[str, str, tuple[int, ...]]]:
    """{tensor name: (file, safetensors dtype, shape)} from the headers only (no tensor is read)."""
    out = {}
    for path in _shard_files(directory):
        try:
            with safetensors.safe_open(path, framework="numpy") as f:
                for name in f.keys():
                    if name in out:
                        raise ValueError(f"{path}: tensor {name!r} is also in {out[name][0]}")
                    view = f.get_slice(name)
                    out[name] = (path, view.get_dtype(), tuple(int(n) for n in view.get_shape()))
        except safetensors.SafetensorError as e:
            raise ValueError(f"{path}: corrupt safetensors file: {e}") from e
    return out


def head_tensors(config: Any) -> dict[str, tuple[str, tuple[int, ...], Transform]]:
    """The embedding, final norm and (untied) output head of a decoder-only HF checkpoint:
    {HF tensor name: (our parameter path, stored shape, transform)}; any family's config with
    vocab_size, emb_dim and tie_word_embeddings."""
    v, e = config.vocab_size, config.emb_dim
    out = {
        "model.embed_tokens.weight": ("token_embedder/embedding", (v, e), _same),
        "model.norm.weight": ("decoder_norm/scale", (e,), _same),
    }
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = ("logits_dense/kernel", (v, e), _same)
    return out


def layer_tensors(
    config: Any, i: int, norms: dict[str, str], bias: bool
) -> dict[str, tuple[str, tuple[int, ...], Transform]]:
    """Layer i's norms ({HF norm name: ours}), attention projections (with their biases when
    `bias`) and gated MLP, as `head_tensors`; heads-major kernels [H, D, E] / [E, H, D]."""
    h, k, d, e, m = (config.num_heads, config.num_kv_heads, config.head_dim, config.emb_dim,
                     config.mlp_dim)  # fmt: skip
    ours, hf = f"layers_{i}", f"model.layers.{i}"
    attn, mlp = f"{ours}/self_attention", f"{ours}/mlp"
    out = {f"{hf}.{theirs}.weight": (f"{ours}/{name}/scale", (e,), _same)
           for theirs, name in norms.items()}  # fmt: skip
    for proj, name, heads in (("q", "query", h), ("k", "key", k), ("v", "value", k)):
        out[f"{hf}.self_attn.{proj}_proj.weight"] = (
            f"{attn}/{name}/kernel", (heads * d, e), _shaped(heads, d, e)
        )  # fmt: skip
        if bias:
            out[f"{hf}.self_attn.{proj}_proj.bias"] = (
                f"{attn}/{name}/bias", (heads * d,), _shaped(heads, d)
            )  # fmt: skip
    out[f"{hf}.self_attn.o_proj.weight"] = (f"{attn}/out/kernel", (e, h * d), _shaped(e, h, d))
    out[f"{hf}.mlp.gate_proj.weight"] = (f"{mlp}/wi_0/kernel", (m, e), _same)
    out[f"{hf}.mlp.up_proj.weight"] = (f"{mlp}/wi_1/kernel", (m, e), _same)
    out[f"{hf}.mlp.down_proj.weight"] = (f"{mlp}/wo/kernel", (e, m), _same)
    return out


def _same(w: np.ndarray) -> np.ndarray:
    return w


def _shaped(*shape: int) -> Transform:
    return lambda w: w.reshape(shape)


# The LLaMA layout's two norms, by their HF names.
LLAMA_NORMS = {
    "input_layernorm": "pre_self_attention_layer_norm",
    "post_attention_layernorm": "pre_mlp_layer_norm",
}


def tensor_map(config: DecoderConfig) -> dict[str, tuple[str, tuple[int, ...], Transform]]:
    """{HF tensor name: (DecoderLM parameter path, stored shape, transform to our layout)}."""
    out = head_tensors(config)
    for i in range(config.num_layers):
        out.update(layer_tensors(config, i, LLAMA_NORMS, config.qkv_bias))
    return out


def _is_inv_freq(name: str) -> bool:
    """Old Llama checkpoints store each layer's RoPE buffer; it is checked, not loaded."""
    return name.startswith("model.layers.") and name.endswith(".self_attn.rotary_emb.inv_freq")


def check_headers(
    headers: dict[str, tuple[str, str, tuple[int, ...]]],
    mapping: dict[str, tuple[str, tuple[int, ...], Transform]],
    config: DecoderConfig,
    directory: str,
) -> None:
    """Raises ValueError naming the tensor and its file for a missing, unexpected, mis-shaped or
    non-float tensor."""
    missing = sorted(set(mapping) - set(headers))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"{directory}: tensor {missing[0]!r} is missing{more}")
    allowed = set(mapping) | ({"lm_head.weight"} if config.tie_word_embeddings else set())
    for name in sorted(headers):
        file, dtype, shape = headers[name]
        if name not in allowed and not _is_inv_freq(name):
            raise ValueError(
                f"{file}: unexpected tensor {name!r} with shape {shape} for this config.json "
                f"({config.num_layers} layers, qkv bias {getattr(config, 'qkv_bias', False)}, "
                f"tied head {config.tie_word_embeddings})"
            )
        if dtype not in FLOAT_DTYPES:
            raise ValueError(
                f"{file}: tensor {name!r} has dtype {dtype}, not one of {FLOAT_DTYPES}"
            )
        expected = mapping[name][1] if name in mapping else None
        if name == "lm_head.weight" and name not in mapping:
            expected = (config.vocab_size, config.emb_dim)
        if expected is not None and shape != expected:
            raise ValueError(
                f"{file}: tensor {name!r} has shape {shape}, but config.json implies {expected}"
            )


def _check_extras(handles: dict[str, Any], headers: dict, config: DecoderConfig) -> None:
    """A tied config's lm_head.weight must equal the embedding; stored inv_freq buffers must
    equal the frequencies the config implies."""

    def read(name: str) -> np.ndarray:
        return np.asarray(handles[headers[name][0]].get_tensor(name), np.float32)

    if config.tie_word_embeddings and "lm_head.weight" in headers:
        if not np.array_equal(read("lm_head.weight"), read("model.embed_tokens.weight")):
            raise ValueError(
                f"{headers['lm_head.weight'][0]}: tensor 'lm_head.weight' differs from "
                "'model.embed_tokens.weight' but config.json says tie_word_embeddings"
            )
    inv, _ = rope.frequencies(config.head_dim, config.rope_theta, config.rope_scaling)
    for name in sorted(filter(_is_inv_freq, headers)):
        stored = read(name)
        if stored.shape != inv.shape or not np.allclose(stored, inv, rtol=1e-5, atol=0):
            raise ValueError(
                f"{headers[name][0]}: tensor {name!r} differs from the RoPE frequencies "
                "config.json implies"
            )


def read_config(hf: Any, lm_head: bool, dtype: Any, source: str) -> tuple[Any, str]:
    """(config, note) of a config.json dict by the family registered for its model_type
    (`checkpoints.families`); ValueError starting with source."""
    family = families.of_hf_model_type(hf.get("model_type") if isinstance(hf, dict) else None)
    if family is None:  # refused there, naming the model_type and the ones that are read
        return hf_config.decoder_config(hf, lm_head, dtype, source)
    try:
        return family.hf_config(hf, lm_head, dtype)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from e


def hf_model(config: Any) -> Any:
    """The model (its family's class) of a config `load_hf_decoder` returned."""
    return _family(config).model(config)


def _family(config: Any) -> families.Family:
    family = families.of_config(config)
    if family is None or family.hf_tensor_map is None:
        raise TypeError(f"no model family reads {type(config).__name__} from format 'hf'")
    return family


def load_hf_decoder(path: str | os.PathLike, dtype: Any = jnp.float32) -> tuple[Any, dict]:
    """Reads a Hugging Face Llama / Qwen2 / Mistral / Gemma 2 / Gemma 3 (text) directory.

    Returns:
      (config, params): the DecoderConfig (Gemma: GemmaConfig) of its config.json (config.dtype =
      dtype) and the model's parameter tree (nested dicts of jax arrays of `dtype`); `hf_model`
      gives the model.
    Raises:
      ValueError / FileNotFoundError naming the file (and the tensor or config field): pickled
      weights only, a corrupt file, an unsupported config, or a missing, unexpected, mis-shaped,
      non-float or non-finite tensor.
    """
    directory = os.fspath(path)
    if os.path.isfile(directory):  # config.json or a weights file: its directory
        directory = os.path.dirname(directory) or "."
    source = hf_config.config_path(directory)
    headers = read_headers(directory)
    hf = hf_t5.read_json(source, "config")
    config, note = read_config(hf, "lm_head.weight" in headers, dtype, source)
    if note:
        log.info(f"{directory}: {note}")
    mapping = _family(config).hf_tensor_map(config)
    expected = validation.expected_shapes(
        jax.eval_shape(hf_model(config).init_params, jax.random.PRNGKey(0))
    )
    if {ours for ours, _, _ in mapping.values()} != set(expected):  # a bug here, not in the file
        raise AssertionError("tensor map and model tree differ")
    check_headers(headers, mapping, config, directory)
    files = sorted({file for file, _, _ in headers.values()})
    handles = {file: safetensors.safe_open(file, framework="numpy") for file in files}
    try:
        _check_extras(handles, headers, config)
        flat = {}
        for name, (ours, _, transform) in mapping.items():
            file = headers[name][0]
            value = transform(handles[file].get_tensor(name))
            flat[ours] = validation.cast(value, dtype, name, file)
            del value
    except safetensors.SafetensorError as e:
        raise ValueError(f"{directory}: corrupt safetensors file: {e}") from e
    finally:
        handles.clear()
    return config, validation.unflatten(flat)


read_hf = families.config_reader(load_hf_decoder)  # format 'hf', every family it reads

FAMILY = families.register(
    families.Family(
        name="decoder",
        model=DecoderLM,
        config=DecoderConfig,
        hf_model_types=hf_config.MODEL_TYPES,
        hf_config=hf_config.translate,
        hf_tensor_map=tensor_map,
        features=frozenset({"layer_skip", "shortlist", "feature_head", "int8"}),
        gguf_architectures=gguf.SUPPORTED_ARCHITECTURES,
        gguf_config=gguf.decoder_config,
        gguf_tensor_map=gguf.tensor_map,
        readers=(("gguf", gguf.read_gguf), ("hf", read_hf)),
    )
)
