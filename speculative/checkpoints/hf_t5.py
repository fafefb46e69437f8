"""Hugging Face T5 checkpoints (`config.json` + `model.safetensors` or a sharded index) -> T5X params.

Name and layout mapping (HF `T5ForConditionalGeneration` -> T5X `network.Transformer`):
    shared.weight [V, E]                              -> token_embedder/embedding [V, E]
    {enc,dec}.block.0.layer.0.SelfAttention.relative_attention_bias.weight [R, H]
                                                      -> {stack}/relpos_bias/rel_embedding [H, R]
    *.{q,k,v}.weight [H*D, E] (torch Linear: out, in) -> */{query,key,value}/kernel [E, H*D]
    *.o.weight [E, H*D]                               -> */out/kernel [H*D, E]
    *.DenseReluDense.{wi,wi_0,wi_1}.weight [M, E]     -> */mlp/{wi,wi_0,wi_1}/kernel [E, M]
    *.DenseReluDense.wo.weight [E, M]                 -> */mlp/wo/kernel [M, E]
    *.layer_norm.weight, *.final_layer_norm.weight    -> */scale ([E], unchanged)
    lm_head.weight [V, E]                             -> decoder/logits_dense/kernel [E, V]

The math, checked against both implementations rather than assumed:
- Attention scale: neither side multiplies q.k by 1/sqrt(head_dim) in the forward pass (T5X folds it
  into the query initialiser, HF's T5Attention follows Mesh TF and scales nothing), so trained query
  kernels carry it already and copy across unchanged.
- Output layer: HF multiplies the decoder output by d_model**-0.5 when `scale_decoder_outputs` (new
  configs) or, in older configs, when `tie_word_embeddings` is true; T5X divides by sqrt(emb_dim) iff
  `logits_via_embedding`. The head is tied when `lm_head.weight` is absent or equal to `shared.weight`.
  tied + scaled -> logits_via_embedding (v1.0); otherwise an untied logits_dense whose kernel is
  lm_head.T, times d_model**-0.5 if HF scales (a head both untied and scaled, or tied and unscaled as
  transformers 5 writes v1.1, has no T5X flag of its own but is exactly this kernel).
- MLP: "gated-gelu" is HF's gelu_new (tanh approximation) = T5X's ('gelu', 'linear').
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401 (registers the bfloat16 dtype that safetensors asks numpy for)
import numpy as np
import safetensors

from speculative.checkpoints import families, t5x, validation
from speculative.models import t5

# Element sizes of the safetensors dtypes, for naming the tensor in a header the library refuses.
_ITEMSIZE = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "C64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}

# The safetensors library's own limit on the JSON header (its HEADER_MAX, 100 MB).
_MAX_HEADER_BYTES = 100_000_000

# config.json fields read as sizes: positive integers (None where the field may be null).
_SIZE_FIELDS = (
    "vocab_size",
    "d_model",
    "num_heads",
    "num_layers",
    "num_decoder_layers",
    "d_kv",
    "d_ff",
    "relative_attention_num_buckets",
    "relative_attention_max_distance",
)

_FEED_FORWARD = {
    "relu": ("relu",),
    "gated-gelu": ("gelu", "linear"),
    "gated-gelu_new": ("gelu", "linear"),
    "gated-relu": ("relu", "linear"),
    "gated-silu": ("silu", "linear"),
}

# Tensors HF stores that are aliases of `shared.weight`, never parameters of their own.
_TIED_ALIASES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")


def _header_problem(path: str) -> str | None:
    """Why a safetensors header is inconsistent, naming the tensor; None if no reason is found.

    Only used to explain a file the `safetensors` library has refused (its messages do not always
    name the tensor): tensors must tile the data section in order, each with dtype x shape bytes.
    """
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"truncated safetensors file ({size} bytes, no header)"
        header_len = int.from_bytes(head, "little")
        if 8 + header_len > size:
            return (
                f"truncated safetensors file: header needs {header_len} bytes, file has {size - 8}"
            )
        if header_len > _MAX_HEADER_BYTES:
            return f"header of {header_len} bytes is larger than safetensors allows"
        try:
            header = json.loads(f.read(header_len))
        except (ValueError, RecursionError) as e:
            return f"header is not valid JSON: {e}"
    if not isinstance(header, dict):
        return f"header is a JSON {type(header).__name__}, not an object"
    data_len = size - 8 - header_len
    entries = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        problem = _entry_problem(info)
        if problem:
            return f"tensor {name!r}: {problem}"
        begin, stop = info["data_offsets"]
        nbytes = math.prod(info["shape"]) * _ITEMSIZE[info["dtype"]]
        if stop - begin != nbytes:
            return (
                f"tensor {name!r} has {stop - begin} bytes for shape {tuple(info['shape'])} "
                f"{info['dtype']} ({nbytes} bytes)"
            )
        entries.append((begin, stop, name))
    return _layout_problem(sorted(entries), data_len)


def _layout_problem(entries: list[tuple[int, int, str]], data_len: int) -> str | None:
    """The first overlap, then the first gap or overrun, of (begin, end, name) sorted by offset."""
    for (_, end, previous), (begin, stop, name) in zip(entries, entries[1:]):
        if begin < end:
            return f"tensor {name!r}: data_offsets [{begin}, {stop}) overlap tensor {previous!r}"
    end = 0
    for begin, stop, name in entries:
        if begin != end:
            return f"tensor {name!r}: data_offsets [{begin}, {stop}) leave a gap after byte {end}"
        if stop > data_len:
            return (
                f"truncated safetensors file: tensor {name!r} needs bytes [{begin}, {stop}) of "
                f"the data section, which has {data_len}"
            )
        end = stop
    if end != data_len:
        return f"the data section has {data_len} bytes but the tensors cover {end}"
    return None


def _entry_problem(info: Any) -> str | None:
    """What is malformed in one header entry ({"dtype", "shape", "data_offsets"}), if anything."""
    if not isinstance(info, dict):
        return f"header entry is {info!r}, not an object"
    if info.get("dtype") not in _ITEMSIZE:
        return f"unsupported dtype {info.get('dtype')!r}"

    def naturals(value: Any) -> bool:
        return isinstance(value, list) and all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value
        )

    if not naturals(info.get("shape")):
        return f"shape {info.get('shape')!r} is not a list of non-negative integers"
    offsets = info.get("data_offsets")
    if not naturals(offsets) or len(offsets) != 2 or offsets[0] > offsets[1]:
        return f"data_offsets {offsets!r} are not [begin, end] with 0 <= begin <= end"
    return None


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """Reads one .safetensors file into {name: numpy array} with the `safetensors` library.

    The library validates the header (tensors in order, non-overlapping, inside the file, dtype x
    shape bytes each) before any tensor is read, so a corrupt header cannot allocate more than the
    file holds. bfloat16 comes back as ml_dtypes.bfloat16 (imported above, which numpy needs).
    Raises:
      ValueError naming the file (and the tensor where one is at fault) for a corrupt or truncated
      file; FileNotFoundError if it does not exist.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such safetensors file")
    try:
        with safetensors.safe_open(path, framework="numpy") as f:
            return {name: _get_tensor(f, name, path) for name in f.keys()}
    except safetensors.SafetensorError as e:
        problem = _header_problem(path)
        raise ValueError(
            f"{path}: corrupt safetensors file: {problem or e}"
            + (f" (safetensors: {e})" if problem else "")
        ) from e


def _get_tensor(handle: Any, name: str, path: str) -> np.ndarray:
    try:
        return handle.get_tensor(name)
    except TypeError as e:  # a dtype numpy cannot represent (e.g. float8 without ml_dtypes)
        raise ValueError(f"{path}: tensor {name!r} cannot be read as a numpy array: {e}") from e


def read_json(path: str, role: str) -> Any:
    """json.load of a file, with a ValueError naming the file on invalid JSON or bad encoding."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError
        raise ValueError(f"{path}: {role} is not valid JSON: {e}") from e


def shard_paths(directory: str, index_path: str) -> dict[str, str]:
    """{tensor name: shard file} from model.safetensors.index.json (any HF model), checked for
    shape and for shards outside `directory`."""
    index = read_json(index_path, "safetensors index")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{index_path}: no 'weight_map' object of tensor name -> shard file")
    for shard in set(weight_map.values()):
        if os.path.isabs(shard) or ".." in shard.replace("\\", "/").split("/"):
            raise ValueError(f"{index_path}: shard {shard!r} is outside {directory}")
    return weight_map


def read_hf_weights(directory: str) -> dict[str, np.ndarray]:
    """All tensors of an HF model directory: model.safetensors or model.safetensors.index.json."""
    index_path = os.path.join(directory, "model.safetensors.index.json")
    single = os.path.join(directory, "model.safetensors")
    if os.path.exists(index_path):
        weight_map = shard_paths(directory, index_path)
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            shard_tensors = read_safetensors(os.path.join(directory, shard))
            for name, file in weight_map.items():
                if file == shard:
                    if name not in shard_tensors:
                        raise ValueError(f"{directory}: index lists {name!r} in {shard}, not there")
                    tensors[name] = shard_tensors[name]
        return tensors
    if os.path.exists(single):
        return read_safetensors(single)
    raise FileNotFoundError(
        f"{directory}: no model.safetensors or model.safetensors.index.json (pickled "
        "pytorch_model.bin checkpoints are not read)"
    )


def read_config(path: str) -> dict[str, Any]:
    """An HF config.json as a dict, with a ValueError naming the file for anything unusable.

    Checks that it is a JSON object with an integer `vocab_size`, that the sizes T5 reads are
    positive integers, and that `layer_norm_epsilon` is a positive number.
    """
    hf = read_json(path, "config")
    if not isinstance(hf, dict):
        raise ValueError(f"{path}: config is a JSON {type(hf).__name__}, not an object")
    if "vocab_size" not in hf:
        raise ValueError(f"{path}: config has no 'vocab_size'")
    for key in _SIZE_FIELDS:
        value = hf.get(key)
        if key == "num_decoder_layers" and value is None:
            continue
        if key in hf and not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            raise ValueError(f"{path}: config {key!r} is {value!r}, not a positive integer")
    eps = hf.get("layer_norm_epsilon", 1e-6)
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 < eps < 1:
        raise ValueError(f"{path}: config 'layer_norm_epsilon' is {eps!r}, not a number in (0, 1)")
    for key in ("model_type", "feed_forward_proj"):
        if key in hf and not isinstance(hf[key], str):
            raise ValueError(f"{path}: config {key!r} is {hf[key]!r}, not a string")
    return hf


def config_from_hf(
    hf: dict[str, Any], logits_via_embedding: bool, dtype: Any, source: str = "config.json"
) -> t5.T5Config:
    """T5Config from an HF config.json dict (see `read_config`); the output-layer flag comes from
    the weights. `source` names the file in errors."""
    if hf.get("model_type", "t5") not in ("t5", "mt5", "umt5"):
        raise ValueError(f"{source}: not a T5 config: model_type {hf.get('model_type')!r}")
    if hf.get("model_type") == "umt5":
        raise ValueError(f"{source}: umT5 (per-layer relative position tables) is not supported")
    proj = hf.get("feed_forward_proj", "relu")
    if proj not in _FEED_FORWARD:
        raise ValueError(
            f"{source}: unsupported feed_forward_proj {proj!r}; supported: {sorted(_FEED_FORWARD)}"
        )
    layers = hf.get("num_layers", 6)
    decoder_layers = hf.get("num_decoder_layers")
    return t5.T5Config(
        vocab_size=hf["vocab_size"],
        emb_dim=hf.get("d_model", 512),
        num_heads=hf.get("num_heads", 8),
        num_encoder_layers=layers,
        num_decoder_layers=layers if decoder_layers is None else decoder_layers,
        head_dim=hf.get("d_kv", 64),
        mlp_dim=hf.get("d_ff", 2048),
        mlp_activations=_FEED_FORWARD[proj],
        logits_via_embedding=logits_via_embedding,
        dtype=jnp.dtype(dtype).name,
        num_buckets=hf.get("relative_attention_num_buckets", 32),
        max_distance=hf.get("relative_attention_max_distance", 128),
        layer_norm_eps=hf.get("layer_norm_epsilon", 1e-6),
    )


def _attention(prefix: str, hf_prefix: str) -> dict[str, tuple[str, bool]]:
    parts = {"query": "q", "key": "k", "value": "v", "out": "o"}
    return {
        f"{prefix}/{ours}/kernel": (f"{hf_prefix}.{theirs}.weight", True)
        for ours, theirs in parts.items()
    }


def _mlp(prefix: str, hf_prefix: str, config: t5.T5Config) -> dict[str, tuple[str, bool]]:
    acts = config.mlp_activations
    names = ["wi"] if len(acts) == 1 else [f"wi_{i}" for i in range(len(acts))]
    return {f"{prefix}/{n}/kernel": (f"{hf_prefix}.{n}.weight", True) for n in names + ["wo"]}


def name_map(config: t5.T5Config) -> dict[str, tuple[str, bool]]:
    """{T5X path: (HF tensor name, transpose?)} for every parameter except the output layer."""
    names = {"token_embedder/embedding": ("shared.weight", False)}
    for stack, layers in (
        ("encoder", config.num_encoder_layers),
        ("decoder", config.num_decoder_layers),
    ):
        rel = f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        names[f"{stack}/relpos_bias/rel_embedding"] = (rel, True)
        norm = "encoder_norm" if stack == "encoder" else "decoder_norm"
        names[f"{stack}/{norm}/scale"] = (f"{stack}.final_layer_norm.weight", False)
        for i in range(layers):
            ours, theirs = f"{stack}/layers_{i}", f"{stack}.block.{i}.layer"
            if stack == "encoder":
                blocks = [("pre_attention_layer_norm", "attention", "SelfAttention")]
            else:
                blocks = [
                    ("pre_self_attention_layer_norm", "self_attention", "SelfAttention"),
                    (
                        "pre_cross_attention_layer_norm",
                        "encoder_decoder_attention",
                        "EncDecAttention",
                    ),
                ]
            for j, (norm_name, attn_name, hf_attn) in enumerate(blocks):
                names[f"{ours}/{norm_name}/scale"] = (f"{theirs}.{j}.layer_norm.weight", False)
                names.update(_attention(f"{ours}/{attn_name}", f"{theirs}.{j}.{hf_attn}"))
            j = len(blocks)
            names[f"{ours}/pre_mlp_layer_norm/scale"] = (f"{theirs}.{j}.layer_norm.weight", False)
            names.update(_mlp(f"{ours}/mlp", f"{theirs}.{j}.DenseReluDense", config))
    return names


def _check_layer_counts(config: t5.T5Config, tensors: dict[str, Any], config_path: str) -> None:
    """Refuses a config.json that declares more layers than the weights hold, before the model's
    shapes are built (a corrupt layer count must not make the loader build a huge model)."""
    for stack, layers, key in (
        ("encoder", config.num_encoder_layers, "num_layers"),
        ("decoder", config.num_decoder_layers, "num_decoder_layers"),
    ):
        pattern = re.compile(rf"{stack}\.block\.(\d+)\.")
        blocks = {int(m.group(1)) for name in tensors if (m := pattern.match(name))}
        if layers > (max(blocks) + 1 if blocks else 0):
            raise ValueError(
                f"{config_path}: {key} says {layers} {stack} layers, but the weights have "
                f"{len(blocks)}"
            )


def load_hf_t5(path: str, dtype: Any = jnp.float32) -> tuple[t5.T5Config, dict[str, Any]]:
    """Loads an HF T5 / mT5 / ByT5 directory as (T5Config, T5X-named params cast to dtype).

    Raises ValueError naming the parameter on a missing, unexpected or mis-shaped tensor, naming
    the file on a corrupt or truncated safetensors file or an unusable config.json.
    """
    config_path = os.path.join(path, "config.json")
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"{path}: no config.json")
    hf = read_config(config_path)
    tensors = read_hf_weights(path)

    shared = tensors.get("shared.weight")
    lm_head = tensors.get("lm_head.weight")
    tied = lm_head is None or (
        shared is not None and lm_head.shape == shared.shape and np.array_equal(lm_head, shared)
    )
    scaled = hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True))
    if not isinstance(scaled, bool):
        raise ValueError(f"{config_path}: 'scale_decoder_outputs' is {scaled!r}, not true/false")
    config = config_from_hf(hf, tied and scaled, dtype, source=config_path)
    _check_layer_counts(config, tensors, config_path)

    names = name_map(config)
    flat = {ours: tensors[theirs] for ours, (theirs, _) in names.items() if theirs in tensors}
    flat = {ours: (a.T if names[ours][1] else a) for ours, a in flat.items()}
    stored = {ours: theirs for ours, (theirs, _) in names.items()}
    if not config.logits_via_embedding:
        head = shared if lm_head is None else lm_head
        stored["decoder/logits_dense/kernel"] = (
            "lm_head.weight" if lm_head is not None else ("shared.weight")
        )
        if head is not None:
            kernel = np.asarray(head, np.float32).T
            flat["decoder/logits_dense/kernel"] = (
                kernel * config.emb_dim**-0.5 if scaled else kernel
            )

    used = {theirs for theirs, _ in names.values()} | {"lm_head.weight", *_TIED_ALIASES}
    extra = sorted(set(tensors) - used)
    if extra:
        raise ValueError(
            f"{path}: unexpected tensor {extra[0]!r} with shape {tensors[extra[0]].shape}: "
            "the weights do not match config.json"
        )
    model = t5.T5(config)
    expected = jax.eval_shape(model.init_params, jax.random.PRNGKey(0))
    params = validation.to_params(flat, expected, dtype, path, stored_names=stored)
    return config, params


# T5 is read by its own loaders (format 'hf_t5', `load_hf_t5`; 't5x', whose checkpoints leave the
# architecture to ModelSpec.model), not through the decoder-only one.
FAMILY = families.register(
    families.Family(
        name="t5",
        model=t5.T5,
        config=t5.T5Config,
        hf_model_types=("t5", "mt5"),
        readers=(("hf_t5", families.config_reader(load_hf_t5)), ("t5x", t5x.read_t5x)),
        model_formats=("t5x",),
    )
)
