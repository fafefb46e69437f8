"""Bytes per device of params and decode caches under a mesh, and a planner: does a config fit?

Everything is computed from shapes (`jax.eval_shape`) and the partitioning rules, so an 11B model is
planned on a laptop without devices. Per-device bytes of an array = its bytes / the product of the
mesh axes its dimensions are split over (replicated dimensions cost the full size on every device).

The command line (`python -m speculative.memory`: the paper's T5 configs) is speculative/memory.py.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import pathlib
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from speculative.models import base
from speculative.parallel import partitioning

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class Device:
    """An accelerator slice: `count` devices (as JAX sees them) of `memory_bytes` each."""

    name: str
    memory_bytes: int
    count: int


# Nominal HBM per JAX device. A TPU v4 chip (two TensorCores, "megacore") is one JAX device with
# 32 GiB; a v4-8 slice has 4 chips. GPU sizes are what nvidia-smi reports (81559 / 143771 MiB).
DEVICES = {
    "tpu-v4-8": Device("TPU v4-8 (4 chips x 32 GiB)", 32 * GIB, 4),
    "h100-80gb": Device("H100 80GB", 81559 * 1024**2, 1),
    "h200-141gb": Device("H200 141GB", 143771 * 1024**2, 1),
}


def array_bytes_per_device(
    shape: tuple[int, ...], dtype: Any, mesh_spec: Any, mesh_shape: Mapping[str, int]
) -> int:
    """Bytes one device holds of an array [shape] placed with the mesh PartitionSpec `mesh_spec`."""
    split = 1
    for entry in tuple(mesh_spec):
        names = entry if isinstance(entry, tuple) else (() if entry is None else (entry,))
        split *= math.prod(mesh_shape[n] for n in names)
    return math.prod(shape) * jnp.dtype(dtype).itemsize // split


def _tree_bytes(shapes: Any, logical: Any, rules, mesh_shape, dtype=None) -> int:
    specs = jax.tree_util.tree_leaves(logical, is_leaf=partitioning.is_spec)
    leaves = jax.tree_util.tree_leaves(shapes)
    return sum(
        array_bytes_per_device(
            leaf.shape, dtype or leaf.dtype, partitioning.mesh_axes(spec, rules), mesh_shape
        )
        for leaf, spec in zip(leaves, specs, strict=True)
    )


def param_bytes(model: Any, rules, mesh_shape: Mapping[str, int], dtype: Any) -> int:
    """Bytes per device of the model's params cast to dtype, placed by `rules` on the mesh."""
    rules = partitioning.resolve_rules(model, rules, mesh_shape)
    return _tree_bytes(
        partitioning.param_shapes(model), partitioning.param_axes(model), rules, mesh_shape, dtype
    )


@functools.lru_cache(maxsize=64)
def _state_shapes(model: Any, batch_size: int, input_len: int, cache_len: int) -> Any:
    if model.is_encoder_decoder:
        batch = {"encoder_input_tokens": jax.ShapeDtypeStruct((batch_size, input_len), jnp.int32)}
    else:
        batch = {"prompt": jax.ShapeDtypeStruct((batch_size, input_len), jnp.int32)}
    return jax.eval_shape(
        lambda p, b: model.init_state(p, b, cache_len), partitioning.param_shapes(model), batch
    )


def cache_len(model: Any, input_len: int, max_decode_len: int, gamma: int) -> int:
    """The decoder cache length speculative decoding allocates (the model's own formula)."""
    return model.cache_length(input_len, max_decode_len, gamma + 1)


def state_bytes(
    model: Any,
    rules,
    mesh_shape: Mapping[str, int],
    batch_size: int,
    input_len: int,
    max_decode_len: int,
    gamma: int,
    cache_length: int | None = None,
) -> int:
    """Bytes per device of the decode state: KV cache, index, and (T5) encoder mask + cross K/V.

    cache_length: the decoder cache's slots where the model's own formula (`cache_len`) is not
    what is allocated (a draft with another tokenizer: `CrossVocabDrafter.cache_length`)."""
    rules = partitioning.resolve_rules(model, rules, mesh_shape)
    partitioning.check_batch_size(batch_size, mesh_shape, rules)
    length = cache_length or cache_len(model, input_len, max_decode_len, gamma)
    shapes = _state_shapes(model, batch_size, input_len, length)
    logical = base.decode_state_axes(shapes, partitioning.cache_heads_axis(model))
    return _tree_bytes(shapes, logical, rules, mesh_shape)


def workspace_bytes(
    target: Any, mesh_shape: Mapping[str, int], batch_size: int, input_len: int, gamma: int
) -> int:
    """A rough upper estimate of the transient buffers XLA needs besides params and caches.

    Verify step: float32 logits [B, G+1, V] and ~3 same-sized temporaries (log-probs, sort for top-p,
    residual). Prefill: float32 activations [B, L, max(E, M)] x 4 and attention scores [B, H, L, L]
    (split over 'data' for B and 'model' for V, M, H).
    """
    cfg = target.config
    rows = math.ceil(batch_size / mesh_shape.get("data", 1))
    model = mesh_shape.get("model", 1)
    logits = 4 * rows * (gamma + 1) * math.ceil(cfg.vocab_size / model) * 4
    width = max(cfg.emb_dim, math.ceil(cfg.mlp_dim / model))
    activations = 4 * rows * input_len * width * 4
    scores = rows * math.ceil(cfg.num_heads / model) * input_len * input_len * 4
    return logits + activations + scores


@dataclasses.dataclass(frozen=True)
class Plan:
    """Bytes per device of one (target, draft, mesh, batch) configuration on one device type."""

    device: Device
    mesh_shape: tuple[tuple[str, int], ...]
    target_params: int
    draft_params: int
    target_cache: int
    draft_cache: int
    workspace: int
    usable_fraction: float

    @property
    def total(self) -> int:
        return (
            self.target_params
            + self.draft_params
            + self.target_cache
            + self.draft_cache
            + self.workspace
        )

    @property
    def usable(self) -> int:
        return int(self.device.memory_bytes * self.usable_fraction)

    @property
    def fits(self) -> bool:
        return self.total <= self.usable

    def row(self) -> dict[str, Any]:
        """GiB figures for a table / JSON."""
        gib = {
            k: round(getattr(self, k) / GIB, 3)
            for k in (
                "target_params",
                "draft_params",
                "target_cache",
                "draft_cache",
                "workspace",
                "total",
                "usable",
            )
        }
        mesh = "x".join(str(n) for _, n in self.mesh_shape)
        return {"device": self.device.name, "mesh": mesh, **gib, "fits": self.fits}


def plan(
    target: Any,
    draft: Any,
    device: Device | str,
    *,
    batch_size: int,
    input_len: int,
    max_decode_len: int,
    gamma: int,
    param_dtype: Any = jnp.bfloat16,
    mesh_shape: Mapping[str, int] | None = None,
    target_rules=partitioning.TARGET_RULES,
    draft_rules=partitioning.DRAFT_RULES,
    usable_fraction: float = 0.9,
) -> Plan:
    """Per-device memory of speculative decoding with (target, draft) on `device`.

    Args:
      device: a `Device` or a key of DEVICES.
      input_len: encoder input length (T5) or padded prompt width (decoder-only).
      param_dtype: dtype the checkpoints are loaded in; caches use each model's config dtype.
      mesh_shape: {"data": d, "model": m}; default: all devices of the slice on 'model'.
      usable_fraction: share of HBM the plan may use (XLA scratch, fragmentation; on GPU also set
        XLA_PYTHON_CLIENT_MEM_FRACTION, JAX preallocates 75% by default).
    Raises:
      ValueError naming the dimension when the mesh does not divide the models or the batch.
    """
    device = DEVICES[device] if isinstance(device, str) else device
    mesh_shape = dict(mesh_shape or {"data": 1, "model": device.count})
    if math.prod(mesh_shape.values()) != device.count:
        raise ValueError(f"mesh {mesh_shape} does not use the {device.count} devices of {device}")
    args = (batch_size, input_len, max_decode_len, gamma)
    return Plan(
        device=device,
        mesh_shape=tuple(mesh_shape.items()),
        target_params=param_bytes(target, target_rules, mesh_shape, param_dtype),
        draft_params=param_bytes(draft, draft_rules, mesh_shape, param_dtype),
        target_cache=state_bytes(target, target_rules, mesh_shape, *args),
        draft_cache=state_bytes(draft, draft_rules, mesh_shape, *args),
        workspace=workspace_bytes(target, mesh_shape, batch_size, input_len, gamma),
        usable_fraction=usable_fraction,
    )


def job_report(
    target: Any,
    draft: Any | None,
    *,
    batch_size: int,
    input_len: int,
    max_decode_len: int,
    gamma: int,
    param_dtype: Any,
    mesh_shape: Mapping[str, int] | None = None,
    draft_parts: Mapping[str, int] | None = None,
) -> str:
    """One line of bytes per device (params and decode state, target and draft) for a job's log.

    mesh_shape defaults to one device ({"data": 1, "model": 1}), how the jobs decode today.
    draft_parts: the draft's bytes by part where the caller counts them (a draft with another
    tokenizer, `draft` None: `jobs.common.cross_draft_bytes`, its params, cache and tables).
    """
    mesh_shape = dict(mesh_shape or {"data": 1, "model": 1})
    args = (batch_size, input_len, max_decode_len, gamma)
    parts = {
        "target params": param_bytes(target, partitioning.TARGET_RULES, mesh_shape, param_dtype),
        "target cache": state_bytes(target, partitioning.TARGET_RULES, mesh_shape, *args),
    }
    if draft is not None:
        parts["draft params"] = param_bytes(
            draft, partitioning.DRAFT_RULES, mesh_shape, param_dtype
        )
        parts["draft cache"] = state_bytes(draft, partitioning.DRAFT_RULES, mesh_shape, *args)
    parts.update(draft_parts or {})
    mesh = "x".join(str(n) for n in mesh_shape.values())
    items = ", ".join(f"{k} {v / GIB:.3f}" for k, v in parts.items())
    return f"memory per device (GiB, mesh {mesh}): {items}; total {sum(parts.values()) / GIB:.3f}"


def format_table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of `Plan.row()` dicts (plus any extra leading keys)."""
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        lines.append("| " + " | ".join(str(row[k]) for k in keys) + " |")
    return "\n".join(lines)


def paper_configs(dtype: str = "bfloat16") -> dict[str, Any]:
    """T5 v1.1 XXL target and small / base / large drafts from configs/models/t5_1_1/*.gin."""
    import gin

    from speculative.config import configurables

    root = str(pathlib.Path(__file__).resolve().parents[2])  # includes are relative to the repo
    models = {}
    for size in ("xxl", "small", "base", "large"):
        gin.clear_config()
        models[size] = configurables.build_model(
            [f"{root}/configs/models/t5_1_1/{size}.gin"],
            [f"t5.T5Config.dtype = '{dtype}'"],
            search_path=root,
        )
    gin.clear_config()
    return models


def paper_report(
    batch_size: int = 1, input_len: int = 512, max_decode_len: int = 128, gamma: int = 7
) -> list[dict[str, Any]]:
    """Memory rows for T5 v1.1 XXL + each draft on TPU v4-8, H100 80GB and H200 141GB (bf16)."""
    models = paper_configs()
    rows = []
    for draft in ("small", "base", "large"):
        for device in DEVICES:
            p = plan(
                models["xxl"],
                models[draft],
                device,
                batch_size=batch_size,
                input_len=input_len,
                max_decode_len=max_decode_len,
                gamma=gamma,
            )
            rows.append({"target": "t5_1_1 xxl", "draft": f"t5_1_1 {draft}", **p.row()})
    return rows
