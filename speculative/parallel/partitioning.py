"""SPMD partitioning: a ('data', 'model') device mesh and T5X-style logical-axis rules.

Every parameter already carries logical axis names (`model.logical_axes()`); decode states get theirs
from `base.decode_state_axes`. Rules map logical names to mesh axes, and JAX's GSPMD partitioner
inserts every collective: nothing here communicates by hand.

Default rules (T5X tradition):
    batch -> 'data'; vocab, heads, kv_heads, joined_kv (= heads x head_dim), mlp -> 'model';
    embed, kv (head_dim), length, relpos_buckets -> replicated.
The draft gets its own rules; by default it is replicated over 'model' (batch still on 'data'):
a small draft is cheaper to recompute on every model shard than to split.

Divisibility: a sharded dimension must divide by its mesh axis, else `resolve_rules` raises a
ValueError naming the config field, e.g. "num_heads=6 is not divisible by the 'model' mesh axis of
size 4". One exception, GQA: when num_kv_heads does not divide by the axis (kv_heads < model is
common, e.g. 2 kv heads on 8 devices), the key/value projections and the KV cache are replicated over
'model' instead (the query heads stay split); `strict_kv_heads=True` makes that an error too.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import gin
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from speculative.models import base

Rules = tuple[tuple[str, Any], ...]

TARGET_RULES: Rules = (
    ("batch", "data"),
    ("vocab", "model"),
    ("heads", "model"),
    ("kv_heads", "model"),
    ("joined_kv", "model"),
    ("mlp", "model"),
    ("embed", None),
    ("kv", None),
    ("length", None),
    ("relpos_buckets", None),
)
DRAFT_RULES: Rules = (("batch", "data"),) + tuple((name, None) for name, _ in TARGET_RULES[1:])

# Logical axis -> the config field that sets its size, for error messages.
_FIELD = {
    "batch": "batch size",
    "vocab": "vocab_size",
    "heads": "num_heads",
    "kv_heads": "num_kv_heads",
    "joined_kv": "num_heads * head_dim",
    "mlp": "mlp_dim",
    "embed": "emb_dim",
    "kv": "head_dim",
    "relpos_buckets": "num_buckets",
}


def as_rules(rules: Sequence[Sequence[Any]]) -> Rules:
    """Gin and JSON give lists; a tuple of pairs is hashable (rules are static jit arguments)."""
    return tuple((str(name), tuple(ax) if isinstance(ax, list) else ax) for name, ax in rules)


@gin.configurable(module="partitioning")
def create_mesh(data: int = 1, model: int = 1, devices: Sequence[Any] | None = None) -> Mesh:
    """A (data, model) mesh of the first data*model devices, GSPMD (Auto) axes.

    jax.make_mesh picks a device order that follows the physical topology (ICI rings on TPU).
    """
    devices = list(jax.devices() if devices is None else devices)
    if data < 1 or model < 1:
        raise ValueError(f"mesh axis sizes must be >= 1, got data={data}, model={model}")
    if data * model > len(devices):
        raise ValueError(
            f"a {data}x{model} ('data', 'model') mesh needs {data * model} devices, "
            f"only {len(devices)} are available"
        )
    auto = (jax.sharding.AxisType.Auto,) * 2
    return jax.make_mesh(
        (data, model), ("data", "model"), axis_types=auto, devices=devices[: data * model]
    )


def mesh_axes(spec: PartitionSpec | None, rules: Rules) -> PartitionSpec:
    """Logical PartitionSpec -> mesh PartitionSpec (unknown names are replicated)."""
    return nn.logical_to_mesh_axes(tuple(spec) if spec is not None else (), rules)


def _axis_size(entry: Any, mesh_shape: Mapping[str, int]) -> int:
    if entry is None:
        return 1
    names = entry if isinstance(entry, tuple) else (entry,)
    return math.prod(mesh_shape[n] for n in names)


def is_spec(x: Any) -> bool:
    """True for a PartitionSpec: the `is_leaf` that keeps specs whole in tree maps over axes."""
    return isinstance(x, PartitionSpec)


def check_divisible(
    shapes: Any, logical: Any, rules: Rules, mesh_shape: Mapping[str, int], what: str
) -> None:
    """Raises ValueError naming the first dimension that its mesh axis does not divide.

    Args:
      shapes: tree of arrays / ShapeDtypeStructs; logical: the same tree of logical PartitionSpecs.
      what: the owner, for the message (e.g. "target DecoderLM").
    """
    flat_specs = jax.tree_util.tree_flatten_with_path(logical, is_leaf=is_spec)[0]
    flat_shapes = jax.tree_util.tree_leaves(shapes)
    for (path, spec), leaf in zip(flat_specs, flat_shapes, strict=True):
        mesh_spec = mesh_axes(spec, rules)
        for dim, name, entry in zip(leaf.shape, tuple(spec), tuple(mesh_spec)):
            size = _axis_size(entry, mesh_shape)
            if dim % size:
                field = _FIELD.get(name, f"logical axis {name!r}")
                raise ValueError(
                    f"{what}: {field}={dim} is not divisible by the {entry!r} mesh axis of size "
                    f"{size} (logical axis {name!r} of {jax.tree_util.keystr(path)}); use a "
                    f"mesh that divides it or map {name!r} to None in the rules"
                )


def check_batch_size(size: int, mesh_shape: Mapping[str, int], rules: Rules = TARGET_RULES) -> None:
    """Raises ValueError when the mesh axis of 'batch' does not divide the batch size."""
    entry = dict(as_rules(rules)).get("batch")
    if size % _axis_size(entry, mesh_shape):
        raise ValueError(
            f"batch size {size} is not divisible by the {entry!r} mesh axis of size "
            f"{_axis_size(entry, mesh_shape)}"
        )


@functools.lru_cache(maxsize=64)
def param_shapes(model: Any) -> Any:
    """Tree of ShapeDtypeStructs of `model.init_params` (tracing only; cached per model)."""
    return jax.eval_shape(model.init_params, jax.random.PRNGKey(0))


@functools.lru_cache(maxsize=64)
def param_axes(model: Any) -> Any:
    """Tree of logical PartitionSpecs of the params (cached per model)."""
    return model.logical_axes()


def cache_heads_axis(model: Any) -> str:
    """Logical name of the KV cache's heads dimension: kv_heads (GQA decoder) or heads (T5)."""
    return "kv_heads" if hasattr(model.config, "num_kv_heads") else "heads"


def resolve_rules(
    model: Any, rules: Rules, mesh_shape: Mapping[str, int], strict_kv_heads: bool = False
) -> Rules:
    """The rules this model actually uses on this mesh, after the GQA fallback; checks divisibility.

    Raises:
      ValueError naming the config field of a parameter dimension the mesh does not divide.
    """
    rules = as_rules(rules)
    kv_heads = getattr(model.config, "num_kv_heads", None)
    kv_entry = dict(rules).get("kv_heads")
    if kv_heads is not None and kv_heads % _axis_size(kv_entry, mesh_shape):
        if strict_kv_heads:
            raise ValueError(
                f"{type(model).__name__}: num_kv_heads={kv_heads} is not divisible by the "
                f"{kv_entry!r} mesh axis of size {_axis_size(kv_entry, mesh_shape)} "
                "(strict_kv_heads=True; False replicates the kv heads instead)"
            )
        rules = tuple((n, None if n == "kv_heads" else ax) for n, ax in rules)
    check_divisible(param_shapes(model), param_axes(model), rules, mesh_shape, type(model).__name__)
    return rules


@functools.lru_cache(maxsize=64)
def _resolved(model, rules, mesh_items, strict_kv_heads):
    return resolve_rules(model, rules, dict(mesh_items), strict_kv_heads)


@dataclasses.dataclass(frozen=True)
class Partitioner:
    """A mesh plus the rules of the target and of the draft. Hashable: a static jit argument.

    `role` is "target" or "draft"; plain decoding uses the target's rules.
    """

    mesh: Mesh
    target_rules: Rules = TARGET_RULES
    draft_rules: Rules = DRAFT_RULES
    strict_kv_heads: bool = False

    def __post_init__(self):
        object.__setattr__(self, "target_rules", as_rules(self.target_rules))
        object.__setattr__(self, "draft_rules", as_rules(self.draft_rules))
        missing = {"data", "model"} - set(self.mesh.axis_names)
        if missing:
            raise ValueError(f"the mesh needs axes 'data' and 'model', got {self.mesh.axis_names}")

    @property
    def mesh_shape(self) -> dict[str, int]:
        return dict(self.mesh.shape)

    def rules(self, model: Any, role: str = "target") -> Rules:
        """Resolved rules of `model` in `role` (raises on a mesh that does not divide it)."""
        if role not in ("target", "draft"):
            raise ValueError(f"role must be 'target' or 'draft', got {role!r}")
        raw = self.target_rules if role == "target" else self.draft_rules
        items = tuple(sorted(self.mesh_shape.items()))
        return _resolved(model, raw, items, self.strict_kv_heads)

    def sharding(self, logical: PartitionSpec, rules: Rules) -> NamedSharding:
        return NamedSharding(self.mesh, mesh_axes(logical, rules))

    def _shardings(self, logical_tree: Any, rules: Rules) -> Any:
        return jax.tree_util.tree_map(
            lambda s: self.sharding(s, rules), logical_tree, is_leaf=is_spec
        )

    # -- parameters --------------------------------------------------------------------------
    def param_shardings(self, model: Any, role: str = "target") -> Any:
        """Tree of NamedShardings matching `model.init_params`."""
        return self._shardings(param_axes(model), self.rules(model, role))

    def place_params(self, model: Any, params: Any, role: str = "target") -> Any:
        """Puts each parameter on its shards (a no-op for params already placed this way)."""
        shardings = self.param_shardings(model, role)
        if jax.tree_util.tree_structure(params) != jax.tree_util.tree_structure(shardings):
            raise ValueError(f"params do not match the parameter tree of {model!r}")
        return jax.device_put(params, shardings)

    # -- decode state ------------------------------------------------------------------------
    def state_shardings(self, model: Any, state: base.DecodeState, role: str) -> Any:
        """DecodeState of NamedShardings: batch on 'data', (kv) heads as the rules say."""
        rules = self.rules(model, role)
        logical = base.decode_state_axes(state, cache_heads_axis(model))
        check_divisible(state, logical, rules, self.mesh_shape, f"{role} decode state")
        return self._shardings(logical, rules)

    def constrain_state(self, model: Any, state: base.DecodeState, role: str) -> Any:
        """`with_sharding_constraint` on a traced state (inside jit)."""
        return jax.lax.with_sharding_constraint(state, self.state_shardings(model, state, role))

    # -- per-row arrays (batch, outputs) -----------------------------------------------------
    def row_sharding(self, ndim: int) -> NamedSharding:
        """Leading axis on 'data', the rest replicated."""
        return self.sharding(PartitionSpec("batch", *(None,) * (ndim - 1)), self.target_rules)

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    def check_batch(self, size: int) -> None:
        check_batch_size(size, self.mesh_shape, self.target_rules)

    def batch_shardings(self, batch: Mapping[str, Any]) -> dict[str, NamedSharding]:
        return {k: self.row_sharding(np.ndim(v)) for k, v in batch.items()}

    def place_batch(self, batch: Mapping[str, Any]) -> dict[str, jax.Array]:
        """Rows of every batch array on 'data' (raises if the batch does not divide)."""
        for value in batch.values():
            self.check_batch(np.shape(value)[0])
        return jax.device_put(dict(batch), self.batch_shardings(batch))

    def constrain_rows(self, tree: Any) -> Any:
        """`with_sharding_constraint`: every leaf's leading (batch) axis on 'data'."""
        return jax.tree_util.tree_map(
            lambda x: jax.lax.with_sharding_constraint(x, self.row_sharding(x.ndim)), tree
        )


@gin.configurable(module="partitioning")
def create_partitioner(
    data: int = 1,
    model: int = 1,
    target_rules: Sequence[Sequence[Any]] = TARGET_RULES,
    draft_rules: Sequence[Sequence[Any]] = DRAFT_RULES,
    strict_kv_heads: bool = False,
    devices: Sequence[Any] | None = None,
) -> Partitioner:
    """Mesh + rules from gin, e.g. `partitioning.create_partitioner.model = 4`."""
    return Partitioner(
        create_mesh(data, model, devices), target_rules, draft_rules, strict_kv_heads
    )


# ------------------------------------------------------------------------------------------------
# Inspecting compiled HLO: which collectives run, and which inside loops (every decode step).

_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLED = re.compile(r"(?:calls|body|condition|to_apply)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_COLLECTIVE = re.compile(
    r"=\s*(\S+)\s+(all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)"
    r"(?:-start)?\("
)
_WHILE_BODY = re.compile(r"\bwhile\(.*body=%?([\w.\-]+)")
_SHAPE = re.compile(r"[a-z]+\d*\[([\d,]*)\]")


def _computations(hlo_text: str) -> dict[str, list[str]]:
    """{computation name: its instruction lines} of HLO text."""
    comps, current = {}, None
    for line in hlo_text.splitlines():
        match = _COMPUTATION.match(line)
        if match and not line.startswith(" "):
            current = comps.setdefault(match.group(1), [])
        elif line.startswith("}"):
            current = None
        elif current is not None:
            current.append(line)
    return comps


def collectives(hlo_text: str, loops_only: bool = False) -> list[tuple[str, tuple[int, ...]]]:
    """(op, result shape) of the collectives of compiled (partitioned) HLO text.

    loops_only: only those reachable from a while body, i.e. run on every decode step / round.
    XLA hoists loop-invariant collectives (e.g. a weight all-gather) out of the loop, so a check for
    materialised full weights must look at the whole module. Tuple results list their first element.
    """
    comps = _computations(hlo_text)
    if loops_only:
        roots = [
            m.group(1)
            for lines in comps.values()
            for line in lines
            if (m := _WHILE_BODY.search(line))
        ]
    else:
        roots = list(comps)
    seen, stack = set(), roots
    while stack:
        name = stack.pop()
        if name in seen or name not in comps:
            continue
        seen.add(name)
        for line in comps[name]:
            stack += _CALLED.findall(line)
            for group in _BRANCHES.findall(line):
                stack += [g.strip().lstrip("%") for g in group.split(",")]
    found = []
    for name in seen:
        for line in comps[name]:
            match = _COLLECTIVE.search(line)
            if match:
                dims = _SHAPE.search(match.group(1)).group(1)
                found.append((match.group(2), tuple(int(d) for d in dims.split(",") if d)))
    return found
