"""A Hugging Face Llama / Qwen2 / Mistral `config.json` -> models.decoder.DecoderConfig.

Both layouts transformers has written are read: version 4's `rope_theta` + `rope_scaling` (its type
under "type" or "rope_type") and version 5's `rope_parameters`; `layer_types` (v5) or
`use_sliding_window` / `max_window_layers` (v4 Qwen2) or `sliding_window` (Mistral) for windows.

Nothing the decoder cannot compute exactly is dropped: it is refused, naming the field and the file,
or mapped to an exact equivalent over a capped context (DecoderConfig.max_seq_len, which decoding
enforces):
  - RoPE 'linear', 'llama3', 'yarn': computed (models.rope). 'default': plain RoPE.
  - RoPE 'dynamic' (NTK): HF rescales only once a sequence passes max_position_embeddings, so up to
    there it is plain RoPE; the context is capped at max_position_embeddings.
  - Sliding-window attention of window W: a query sees keys less than W positions back, which within
    W positions is every key; the context is capped at W.
  - Any other RoPE type ('longrope', ...), partial rotary dims, activations other than SiLU, an
    output-projection or MLP bias, other layer kinds: refused.
"""

from __future__ import annotations

import math
import os
from typing import Any

import jax.numpy as jnp

from speculative.checkpoints import families
from speculative.models.decoder import DecoderConfig

MODEL_TYPES = ("llama", "qwen2", "mistral")


def positive(hf: dict[str, Any], key: str, kind: type, default: Any = None) -> Any:
    value = hf.get(key, default)
    if value is None:
        raise ValueError(f"config has no {key!r}")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"config {key!r} is {value!r}, not a number")
    if not (math.isfinite(value) and value > 0) or (kind is int and not isinstance(value, int)):
        raise ValueError(f"config {key!r} is {value!r}, not a positive {kind.__name__}")
    return kind(value)


def rope_parameters(hf: dict[str, Any]) -> tuple[float, tuple[tuple[str, Any], ...], int | None]:
    """(theta, DecoderConfig.rope_scaling, context cap or None) of a config."""
    params = hf.get("rope_parameters")
    if params is None:  # transformers 4: rope_theta beside an optional rope_scaling
        params = {"rope_theta": hf.get("rope_theta", 10000.0), **(hf.get("rope_scaling") or {})}
    if not isinstance(params, dict):
        raise ValueError(f"config 'rope_parameters' is {params!r}, not an object")
    if params and all(isinstance(v, dict) for v in params.values()):
        raise ValueError("per-layer-type RoPE parameters are not supported")
    params = dict(params)
    kind = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    theta = positive({"rope_theta": params.pop("rope_theta", hf.get("rope_theta", 10000.0))},
                      "rope_theta", float)  # fmt: skip
    partial = params.pop("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ValueError(
            f"partial rotary embeddings (partial_rotary_factor {partial}) are not supported"
        )
    if kind == "default":
        return theta, (), None
    if kind == "dynamic":
        return theta, (), positive(hf, "max_position_embeddings", int)
    if kind not in ("linear", "llama3", "yarn"):
        raise ValueError(
            f"RoPE scaling type {kind!r} is not supported (supported: linear, llama3, yarn, "
            "dynamic within max_position_embeddings)"
        )
    if kind in ("llama3", "yarn"):  # transformers' default for both
        original = params.get("original_max_position_embeddings")
        params["original_max_position_embeddings"] = original or hf.get("max_position_embeddings")
    if kind == "yarn" and params.get("factor") is None and hf.get("max_position_embeddings"):
        params["factor"] = (
            hf["max_position_embeddings"] / params["original_max_position_embeddings"]
        )
    scaling = tuple(sorted({**params, "rope_type": kind}.items()))
    return theta, scaling, None


def sliding_window(hf: dict[str, Any]) -> int | None:
    """The attention window of any sliding-window layer (None: every layer attends fully)."""
    num_layers = hf.get("num_hidden_layers")
    types = hf.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != num_layers:
            raise ValueError(f"config 'layer_types' is not a list of {num_layers} layer kinds")
        unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
        if unknown:
            raise ValueError(f"layer kind {unknown[0]!r} (config 'layer_types') is not supported")
        sliding = "sliding_attention" in types
    elif hf.get("model_type") == "qwen2":
        window_layers = hf.get("max_window_layers", num_layers)
        sliding = bool(hf.get("use_sliding_window")) and window_layers < num_layers
    else:
        sliding = hf.get("sliding_window") is not None
    if not sliding:
        return None
    return positive(hf, "sliding_window", int)


def _check_supported(hf: dict[str, Any]) -> None:
    if hf.get("model_type") not in MODEL_TYPES:
        hint = (
            " (save the text model: Gemma3ForCausalLM)" if hf.get("model_type") == "gemma3" else ""
        )
        raise ValueError(
            f"config model_type {hf.get('model_type')!r} is not a supported decoder-only "
            f"architecture ({', '.join(families.hf_model_types())}){hint}"
        )
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"config hidden_act {act!r} is not supported (only 'silu')")
    if hf.get("mlp_bias"):
        raise ValueError("config mlp_bias is true: MLP biases are not supported")
    if hf.get("model_type") == "llama" and hf.get("attention_bias"):
        raise ValueError(
            "config attention_bias is true: an output-projection bias is not supported"
        )


def decoder_config(
    hf: dict[str, Any], lm_head: bool, dtype: Any = jnp.float32, source: str = "config.json"
) -> tuple[DecoderConfig, str]:
    """(DecoderConfig, note on a capped context or "") of a config.json dict.

    lm_head: whether the weights hold `lm_head.weight`; it decides the head when the config does
    not say `tie_word_embeddings`. Raises ValueError starting with `source`.
    """
    try:
        return translate(hf, lm_head, dtype)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from e


def translate(hf: dict[str, Any], lm_head: bool, dtype: Any) -> tuple[DecoderConfig, str]:
    """`decoder_config` without the file name in its errors (the 'decoder' family's hf_config)."""
    if not isinstance(hf, dict):
        raise ValueError(f"config is a JSON {type(hf).__name__}, not an object")
    _check_supported(hf)
    emb = positive(hf, "hidden_size", int)
    heads = positive(hf, "num_attention_heads", int)
    head_dim = hf.get("head_dim") or emb // heads
    theta, scaling, cap = rope_parameters(hf)
    window = sliding_window(hf)
    context = positive(hf, "max_position_embeddings", int, 4096)
    notes = []
    if cap is not None:
        notes.append(f"RoPE 'dynamic' is plain RoPE up to {cap} tokens")
    if window is not None:
        notes.append(f"sliding-window attention equals full attention up to {window} tokens")
    limit = min([context] + [c for c in (cap, window) if c is not None])
    tied = hf.get("tie_word_embeddings", not lm_head)
    if not isinstance(tied, bool):
        raise ValueError(f"config 'tie_word_embeddings' is {tied!r}, not true/false")
    note = f"context capped at {limit} tokens ({'; '.join(notes)})" if notes else ""
    return DecoderConfig(
        vocab_size=positive(hf, "vocab_size", int),
        emb_dim=emb,
        num_layers=positive(hf, "num_hidden_layers", int),
        num_heads=heads,
        num_kv_heads=positive(hf, "num_key_value_heads", int, heads),
        head_dim=positive({"head_dim": head_dim}, "head_dim", int),
        mlp_dim=positive(hf, "intermediate_size", int),
        rope_theta=theta,
        rope_scaling=scaling,
        norm_eps=positive(hf, "rms_norm_eps", float, 1e-6),
        qkv_bias=hf.get("model_type") == "qwen2" or bool(hf.get("attention_bias")),
        tie_word_embeddings=tied,
        max_seq_len=limit,
        dtype=jnp.dtype(dtype).name,
    ), note


def config_path(directory: str) -> str:
    """directory/config.json, or FileNotFoundError naming the directory."""
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{directory}: no config.json")
    return path
