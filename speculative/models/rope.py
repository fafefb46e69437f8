"""Rotary position embedding frequencies: plain RoPE and the scaled variants Hugging Face configs
name (`rope_scaling` / `rope_parameters`).

A scaling is a hashable tuple of sorted (key, value) pairs, e.g.
(("factor", 8.0), ("rope_type", "linear")), so that it can sit in a frozen model config. Each type
changes only the inverse frequencies [D/2] and a factor that multiplies cos and sin (YaRN's
attention factor; 1 otherwise), both fixed for the whole sequence:

  linear  every frequency / factor (positions interpolated).
  llama3  Llama 3.1: low frequencies / factor, high ones kept, a smooth ramp between
          (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings).
  yarn    YaRN: a ramp between interpolated and original frequencies over the dimensions whose
          rotation counts in original_max_position_embeddings fall between beta_slow and beta_fast;
          cos and sin times attention_factor (default 0.1 ln(factor) + 1, or the mscale ratio).

Types whose frequencies depend on the current sequence length (HF 'dynamic', 'longrope') are not
here: the HF loader maps 'dynamic' to plain RoPE with the context capped where the two agree.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

SCALING_TYPES = ("linear", "llama3", "yarn")
_REQUIRED = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings"),
}
_OPTIONAL = {
    "linear": (),
    "llama3": (),
    "yarn": ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"),
}


def check_scaling(scaling: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    """The scaling as a dict; ValueError naming the type or key when it is unknown or unusable."""
    params = dict(scaling)
    kind = params.get("rope_type")
    if kind not in SCALING_TYPES:
        raise ValueError(f"RoPE scaling type {kind!r} is not supported; supported: {SCALING_TYPES}")
    allowed = {"rope_type", *_REQUIRED[kind], *_OPTIONAL[kind]}
    for key in _REQUIRED[kind]:
        if params.get(key) is None:
            raise ValueError(f"RoPE scaling {kind!r} needs {key!r}")
    for key, value in params.items():
        if key not in allowed:
            raise ValueError(f"RoPE scaling {kind!r} has unknown key {key!r}")
        numeric = key not in ("rope_type", "truncate")
        if numeric and value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"RoPE scaling {key!r} is {value!r}, not a number")
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"RoPE scaling {key!r} is {value!r}, not a positive number")
    if kind == "llama3" and params["high_freq_factor"] <= params["low_freq_factor"]:
        raise ValueError("RoPE scaling 'llama3' needs high_freq_factor > low_freq_factor")
    return params


def _mscale(scale: float, m: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def _llama3(inv: np.ndarray, p: dict[str, Any]) -> np.ndarray:
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old = p["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return np.where(medium, blended, scaled)


def _yarn(inv: np.ndarray, dim: int, theta: float, p: dict[str, Any]) -> tuple[np.ndarray, float]:
    factor, old = p["factor"], p["original_max_position_embeddings"]
    attention = p.get("attention_factor")
    if attention is None:
        ms, ms_all = p.get("mscale"), p.get("mscale_all_dim")
        attention = (
            _mscale(factor, ms) / _mscale(factor, ms_all) if ms and ms_all else _mscale(factor)
        )

    def correction_dim(rotations: float) -> float:  # the dimension turning `rotations` times
        return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(p.get("beta_fast") or 32), correction_dim(p.get("beta_slow") or 1)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    high = high + 0.001 if low == high else high  # no division by zero
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    keep = 1 - ramp  # 1: the original frequency (extrapolated), 0: interpolated
    return inv / factor * (1 - keep) + inv * keep, float(attention)


def frequencies(
    head_dim: int, theta: float, scaling: tuple[tuple[str, Any], ...] = ()
) -> tuple[np.ndarray, float]:
    """(inverse frequencies [head_dim / 2] float32, factor on cos and sin) of a RoPE variant."""
    inv = float(theta) ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if not scaling:
        return inv.astype(np.float32), 1.0
    params = check_scaling(scaling)
    kind, attention = params["rope_type"], 1.0
    if kind == "linear":
        inv = inv / params["factor"]
    elif kind == "llama3":
        inv = _llama3(inv, params)
    else:
        inv, attention = _yarn(inv, head_dim, theta, params)
    return inv.astype(np.float32), attention
