"""Hugging Face Gemma 2 / Gemma 3 (text) `config.json` -> models.gemma.GemmaConfig, and the tensor
map of their safetensors (checkpoints.hf_decoder reads the files).

Read as transformers reads them: `layer_types`, else the default pattern (Gemma 2: even layers
local; Gemma 3: every `sliding_window_pattern`-th layer global, default 6); RoPE from transformers 5's
`rope_parameters` (Gemma 3: one entry per layer kind) or version 4's `rope_theta` / `rope_scaling`
(Gemma 3: global) / `rope_local_base_freq` (Gemma 3: local). Refused, naming the field: another
activation than gelu_pytorch_tanh, attention biases, bidirectional attention, Gemma 3's
`attn_logit_softcapping` (transformers' Gemma 3 ignores it), the multimodal `gemma3` wrapper.

Name mapping beyond hf_decoder's (E = hidden_size, D = head_dim):
    model.layers.{i}.input_layernorm.weight            -> layers_{i}/pre_self_attention_layer_norm/scale
    model.layers.{i}.post_attention_layernorm.weight   -> layers_{i}/post_self_attention_layer_norm/scale
    model.layers.{i}.pre_feedforward_layernorm.weight  -> layers_{i}/pre_mlp_layer_norm/scale
    model.layers.{i}.post_feedforward_layernorm.weight -> layers_{i}/post_mlp_layer_norm/scale
    model.layers.{i}.self_attn.{q,k}_norm.weight [D]   -> .../self_attention/{query,key}_norm/scale
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from speculative.checkpoints import families, hf_config, hf_decoder
from speculative.models.gemma import GemmaConfig, GemmaLM

MODEL_TYPES = ("gemma2", "gemma3_text")
ACTIVATION = "gelu_pytorch_tanh"

Transform = Callable[[np.ndarray], np.ndarray]


def local_layers(hf: dict[str, Any], num_layers: int) -> tuple[bool, ...]:
    """Per layer, whether it is a sliding-window (local) layer."""
    types = hf.get("layer_types")
    if types is None:
        gemma3 = hf.get("model_type") == "gemma3_text"
        period = hf_config.positive(hf, "sliding_window_pattern", int, 6) if gemma3 else 2
        return tuple(bool((i + 1) % period) for i in range(num_layers))
    if not isinstance(types, list) or len(types) != num_layers:
        raise ValueError(f"config 'layer_types' is not a list of {num_layers} layer kinds")
    unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
    if unknown:
        raise ValueError(f"layer kind {unknown[0]!r} (config 'layer_types') is not supported")
    return tuple(t == "sliding_attention" for t in types)


def _ropes(hf: dict[str, Any]) -> tuple[tuple, tuple, int | None]:
    """((global theta, scaling), (local theta, scaling), context cap or None)."""
    params = hf.get("rope_parameters")
    gemma3 = hf.get("model_type") == "gemma3_text"
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        unknown = sorted(set(params) - {"full_attention", "sliding_attention"})
        if unknown:
            raise ValueError(f"config 'rope_parameters' has unknown layer kind {unknown[0]!r}")
        rest = {k: v for k, v in hf.items() if k not in ("rope_theta", "rope_scaling")}
        defaults = {"full_attention": 1e6, "sliding_attention": 1e4}
        found = {}
        for kind, default in defaults.items():
            one = {"rope_theta": default, **params.get(kind, {})}
            found[kind] = hf_config.rope_parameters({**rest, "rope_parameters": one})
        (gt, gs, gcap), (lt, ls, lcap) = found["full_attention"], found["sliding_attention"]
    elif gemma3 and params is None:  # transformers 4: the scaling is the global layers' only
        gt, gs, gcap = hf_config.rope_parameters({**hf, "rope_theta": hf.get("rope_theta", 1e6)})
        local = {"rope_theta": hf.get("rope_local_base_freq", 1e4)}
        lt, ls, lcap = hf_config.rope_parameters(local)
    else:  # Gemma 2: one RoPE for every layer
        gt, gs, gcap = lt, ls, lcap = hf_config.rope_parameters(hf)
    caps = [c for c in (gcap, lcap) if c is not None]
    return (gt, gs), (lt, ls), min(caps) if caps else None


def _check_supported(hf: dict[str, Any]) -> None:
    act = hf.get("hidden_activation") or hf.get("hidden_act") or ACTIVATION
    if act != ACTIVATION:
        raise ValueError(f"config hidden_activation {act!r} is not supported (only {ACTIVATION!r})")
    if hf.get("attention_bias"):
        raise ValueError("config attention_bias is true: attention biases are not supported")
    if hf.get("use_bidirectional_attention"):
        raise ValueError("config use_bidirectional_attention is true: only causal attention")
    if hf.get("model_type") == "gemma3_text" and hf.get("attn_logit_softcapping") is not None:
        raise ValueError(
            "config attn_logit_softcapping is set: transformers' Gemma 3 does not apply it, so "
            "which model is meant is unclear"
        )


def _optional(hf: dict[str, Any], key: str) -> float:
    return 0.0 if hf.get(key) is None else hf_config.positive(hf, key, float)


def gemma_config(hf: dict[str, Any], lm_head: bool, dtype: Any) -> tuple[GemmaConfig, str]:
    """(GemmaConfig, note or "") of a Gemma 2 / Gemma 3 text config.json dict; ValueError naming
    the field (hf_decoder.read_config adds the file)."""
    _check_supported(hf)
    emb = hf_config.positive(hf, "hidden_size", int)
    heads = hf_config.positive(hf, "num_attention_heads", int)
    layers = hf_config.positive(hf, "num_hidden_layers", int)
    local = local_layers(hf, layers)
    window = hf_config.positive(hf, "sliding_window", int) if any(local) else 0
    (gt, gs), (lt, ls), cap = _ropes(hf)
    context = hf_config.positive(hf, "max_position_embeddings", int, 8192)
    tied = hf.get("tie_word_embeddings", not lm_head)
    if not isinstance(tied, bool):
        raise ValueError(f"config 'tie_word_embeddings' is {tied!r}, not true/false")
    note = "" if cap is None else f"context capped at {cap} tokens (RoPE 'dynamic' is plain there)"
    return GemmaConfig(
        vocab_size=hf_config.positive(hf, "vocab_size", int),
        emb_dim=emb,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=hf_config.positive(hf, "num_key_value_heads", int, heads),
        head_dim=hf_config.positive(
            {"head_dim": hf.get("head_dim") or emb // heads}, "head_dim", int
        ),
        mlp_dim=hf_config.positive(hf, "intermediate_size", int),
        rope_theta=gt,
        rope_scaling=gs,
        local_rope_theta=lt,
        local_rope_scaling=ls,
        norm_eps=hf_config.positive(hf, "rms_norm_eps", float, 1e-6),
        query_pre_attn_scalar=hf_config.positive(hf, "query_pre_attn_scalar", float, 256),
        attn_softcap=_optional(hf, "attn_logit_softcapping"),
        final_softcap=_optional(hf, "final_logit_softcapping"),
        qk_norm=hf.get("model_type") == "gemma3_text",
        sliding_window=window,
        local_layers=local if any(local) else (),
        tie_word_embeddings=tied,
        max_seq_len=min(context, cap or context),
        dtype=jnp.dtype(dtype).name,
    ), note


# Gemma's four norms a layer (before and after attention and the MLP), by their HF names.
GEMMA_NORMS = {
    "input_layernorm": "pre_self_attention_layer_norm",
    "post_attention_layernorm": "post_self_attention_layer_norm",
    "pre_feedforward_layernorm": "pre_mlp_layer_norm",
    "post_feedforward_layernorm": "post_mlp_layer_norm",
}


def tensor_map(config: GemmaConfig) -> dict[str, tuple[str, tuple[int, ...], Transform]]:
    """{HF tensor name: (GemmaLM parameter path, stored shape, transform to our layout)}: the
    LLaMA layout's tensors (hf_decoder) with Gemma's four norms a layer and Gemma 3's q/k norms."""
    out = hf_decoder.head_tensors(config)
    for i in range(config.num_layers):
        out.update(hf_decoder.layer_tensors(config, i, GEMMA_NORMS, bias=False))
        if config.qk_norm:
            attn = f"layers_{i}/self_attention"
            for proj, name in (("q", "query"), ("k", "key")):
                out[f"model.layers.{i}.self_attn.{proj}_norm.weight"] = (
                    f"{attn}/{name}_norm/scale", (config.head_dim,), lambda w: w
                )  # fmt: skip
    return out


# Layer skip, shortlist heads and feature heads are written against models.decoder's tree.
FAMILY = families.register(
    families.Family(
        name="gemma",
        model=GemmaLM,
        config=GemmaConfig,
        hf_model_types=MODEL_TYPES,
        hf_config=gemma_config,
        hf_tensor_map=tensor_map,
        readers=(("hf", hf_decoder.read_hf),),
    )
)
