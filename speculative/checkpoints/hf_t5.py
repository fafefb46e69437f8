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
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from speculative.checkpoints import validation
from speculative.models import t5

_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}

_FEED_FORWARD = {
    "relu": ("relu",),
    "gated-gelu": ("gelu", "linear"),
    "gated-gelu_new": ("gelu", "linear"),
    "gated-relu": ("relu", "linear"),
    "gated-silu": ("silu", "linear"),
}

# Tensors HF stores that are aliases of `shared.weight`, never parameters of their own.
_TIED_ALIASES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """Reads one .safetensors file into {name: numpy array} (memory-mapped, no pickle).

    Raises ValueError naming the file and tensor when the file is truncated or inconsistent.
    """
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path}: truncated safetensors file ({size} bytes, no header)")
        header_len = int.from_bytes(head, "little")
        if 8 + header_len > size:
            raise ValueError(
                f"{path}: truncated safetensors file: header needs {header_len} bytes, "
                f"file has {size - 8}"
            )
        try:
            header = json.loads(f.read(header_len))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: corrupt safetensors header: {e}") from e
    header.pop("__metadata__", None)
    data_start = 8 + header_len
    data_len = size - data_start
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=data_start) if data_len else None
    tensors = {}
    for name, info in header.items():
        dtype = _DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {info.get('dtype')!r}")
        shape = tuple(info["shape"])
        begin, end = info["data_offsets"]
        if end > data_len:
            raise ValueError(
                f"{path}: truncated safetensors file: tensor {name!r} needs bytes "
                f"[{begin}, {end}) of the data section, which has {data_len}"
            )
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if end - begin != nbytes:
            raise ValueError(
                f"{path}: tensor {name!r} has {end - begin} bytes for shape {shape} {info['dtype']}"
            )
        raw = data[begin:end] if nbytes else np.zeros((0,), np.uint8)
        tensors[name] = raw.view(dtype).reshape(shape)
    return tensors


def read_hf_weights(directory: str) -> dict[str, np.ndarray]:
    """All tensors of an HF model directory: model.safetensors or model.safetensors.index.json."""
    index_path = os.path.join(directory, "model.safetensors.index.json")
    single = os.path.join(directory, "model.safetensors")
    if os.path.exists(index_path):
        with open(index_path) as f:
            weight_map = json.load(f)["weight_map"]
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


def config_from_hf(hf: dict[str, Any], logits_via_embedding: bool, dtype: Any) -> t5.T5Config:
    """T5Config from an HF config.json dict; the output-layer flag comes from the weights."""
    if hf.get("model_type", "t5") not in ("t5", "mt5", "umt5"):
        raise ValueError(f"not a T5 config: model_type {hf.get('model_type')!r}")
    if hf.get("model_type") == "umt5":
        raise ValueError("umT5 (per-layer relative position tables) is not supported")
    proj = hf.get("feed_forward_proj", "relu")
    if proj not in _FEED_FORWARD:
        raise ValueError(
            f"unsupported feed_forward_proj {proj!r}; supported: {sorted(_FEED_FORWARD)}"
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


def load_hf_t5(path: str, dtype: Any = jnp.float32) -> tuple[t5.T5Config, dict[str, Any]]:
    """Loads an HF T5 / mT5 / ByT5 directory as (T5Config, T5X-named params cast to dtype).

    Raises ValueError naming the parameter on a missing, unexpected or mis-shaped tensor, or a
    truncated file.
    """
    config_path = os.path.join(path, "config.json")
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"{path}: no config.json")
    with open(config_path) as f:
        hf = json.load(f)
    tensors = read_hf_weights(path)

    shared = tensors.get("shared.weight")
    lm_head = tensors.get("lm_head.weight")
    tied = lm_head is None or (
        shared is not None and lm_head.shape == shared.shape and np.array_equal(lm_head, shared)
    )
    scaled = hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True))
    config = config_from_hf(hf, logits_via_embedding=tied and scaled, dtype=dtype)

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
