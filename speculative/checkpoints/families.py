"""Model families: what the loaders and the drafts ask about a model instead of testing its class.

A family is one `Family` registered by the module that translates its checkpoints: its name, the
model class and config class (`models/`), the Hugging Face `model_type`s it reads, its config
translation from `config.json` and its tensor-name map (both None for a family that format 'hf' does
not read), the GGUF `general.architecture`s it reads with their metadata translation and tensor map
(likewise), the `ModelSpec.format`s it reads with its reader of each (`model_loading` asks
`reader(format)`), and what it supports beyond plain and speculative decoding with chains, the block
rule and trees (every family's attention takes a tree mask, `attention.cache_mask`):

  layer_skip    its first layers make a draft (`drafts.layer_skip`)
  shortlist     its output head can be cut to a shortlist (`models.decoder.restrict_head`)
  feature_head  a feature-level head can draft for it (`drafts.feature_head`, `jobs.train_head`)

Registered: 'decoder' (Llama / Qwen2 / Mistral, `checkpoints.hf_decoder`), 'gemma' (Gemma 2 /
Gemma 3 text, `checkpoints.hf_gemma`), 't5' (`checkpoints.hf_t5`). Importing
`speculative.checkpoints` imports all three. Adding a family: docs/design.md §5.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

FEATURES = ("layer_skip", "shortlist", "feature_head", "int8")

# (path, dtype, the spec's model or None) -> (model, params of dtype).
Reader = Callable[[str, Any, Any], tuple[Any, Any]]


@dataclasses.dataclass(frozen=True)
class Family:
    """One model family (module doc). hf_config: (config.json dict, has lm_head.weight, dtype) ->
    (config, note); hf_tensor_map: config -> {HF tensor name: (our path, stored shape, transform)};
    gguf_config: (GGUFReader, {name: tensor}, dtype) -> config; gguf_tensor_map: (config,
    architecture) -> {our path tuple: (GGUF tensor name, transform)}; readers: (format, reader)
    pairs, reader(path, dtype, model or None) -> (model, params); model_formats: the formats whose
    files do not say the architecture (ModelSpec.model gives it)."""

    name: str
    model: type
    config: type
    hf_model_types: tuple[str, ...] = ()
    hf_config: Callable[[dict[str, Any], bool, Any], tuple[Any, str]] | None = None
    hf_tensor_map: Callable[[Any], dict[str, tuple[str, tuple[int, ...], Any]]] | None = None
    features: frozenset[str] = frozenset()
    gguf_architectures: tuple[str, ...] = ()
    gguf_config: Callable[[Any, dict[str, Any], Any], Any] | None = None
    gguf_tensor_map: Callable[[Any, str], dict[tuple[str, ...], tuple[str, Any]]] | None = None
    readers: tuple[tuple[str, Reader], ...] = ()
    model_formats: tuple[str, ...] = ()

    def __post_init__(self):
        unknown = sorted(set(self.features) - set(FEATURES))
        if unknown:
            raise ValueError(f"family {self.name!r}: unknown feature {unknown[0]!r}; {FEATURES}")


_FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Adds a family (returned). Another family of the same name, or one claiming a model class,
    config class, model_type or GGUF architecture another family has, or another reader of a
    format another family reads, is a ValueError; the same family again a no-op."""
    known = _FAMILIES.get(family.name)
    if known is not None and known != family:
        raise ValueError(f"model family {family.name!r} is registered already")
    for other in _FAMILIES.values():
        if other.name == family.name:
            continue
        clash = {other.model, other.config} & {family.model, family.config}
        clash |= set(other.hf_model_types) & set(family.hf_model_types)
        clash |= set(other.gguf_architectures) & set(family.gguf_architectures)
        theirs = dict(other.readers)  # a shared format must have one reader
        clash |= {fmt for fmt, read in family.readers if theirs.get(fmt, read) is not read}
        if clash:
            raise ValueError(f"model family {family.name!r}: {clash} belongs to {other.name!r}")
    _FAMILIES[family.name] = family
    return family


def unregister(name: str) -> None:
    """Removes a family (a test's own, say); no-op for a name never registered."""
    _FAMILIES.pop(name, None)


def names() -> tuple[str, ...]:
    return tuple(sorted(_FAMILIES))


def get(name: str) -> Family:
    if name not in _FAMILIES:
        raise ValueError(f"unknown model family {name!r}; known: {names()}")
    return _FAMILIES[name]


def of_config(config: Any) -> Family | None:
    """The family whose config class `config` is (None for none)."""
    return next((f for f in _FAMILIES.values() if type(config) is f.config), None)


def of_model(model: Any) -> Family | None:
    """The family whose model class `model` is exactly (a wrapper or subclass: None)."""
    return next((f for f in _FAMILIES.values() if type(model) is f.model), None)


def of_hf_model_type(model_type: Any) -> Family | None:
    """The family reading this config.json model_type with format 'hf' (None for none)."""
    return next(
        (
            f
            for f in _FAMILIES.values()
            if model_type in f.hf_model_types and f.hf_tensor_map is not None
        ),
        None,
    )


def hf_model_types() -> tuple[str, ...]:
    """Every model_type format 'hf' reads, for error messages."""
    readable = [_FAMILIES[name] for name in names() if _FAMILIES[name].hf_tensor_map is not None]
    return tuple(t for f in readable for t in f.hf_model_types)


def of_gguf_architecture(arch: Any) -> Family | None:
    """The family reading GGUF files of this `general.architecture` (None for none)."""
    return next((f for f in _FAMILIES.values() if arch in f.gguf_architectures), None)


def gguf_architectures() -> tuple[str, ...]:
    """Every GGUF architecture a family reads, for error messages."""
    return tuple(a for name in names() for a in _FAMILIES[name].gguf_architectures)


def formats() -> tuple[str, ...]:
    """Every ModelSpec.format some family reads (besides 'random'), in registration-name order."""
    found = [fmt for name in names() for fmt, _ in _FAMILIES[name].readers]
    return tuple(dict.fromkeys(found))


def reading(fmt: str) -> tuple[Family, ...]:
    """The families that read format `fmt`."""
    return tuple(_FAMILIES[n] for n in names() if fmt in dict(_FAMILIES[n].readers))


def reader(fmt: str) -> Reader:
    """The reader of format `fmt` (families sharing a format share its reader, which tells them
    apart by the file); ValueError for a format no family reads."""
    found = reading(fmt)
    if not found:
        raise ValueError(f"no model family reads format {fmt!r}; known: {formats()}")
    return dict(found[0].readers)[fmt]  # the same for all (`register`)


def needs_model(fmt: str) -> bool:
    """Whether format `fmt`'s files leave the architecture to ModelSpec.model."""
    return any(fmt in f.model_formats for f in reading(fmt))


def build(config: Any) -> Any:
    """The model (its family's class) of a config; TypeError for a config of no family."""
    family = of_config(config)
    if family is None:
        raise TypeError(f"no model family has config class {type(config).__name__}")
    return family.model(config)


def config_reader(load: Callable[[str, Any], tuple[Any, Any]]) -> Reader:
    """The reader of a format whose files say the architecture: load(path, dtype) -> (config,
    params), the model built by the config's family (`build`); the reader's model argument unused."""

    def read(path: str, dtype: Any, model: Any = None) -> tuple[Any, Any]:
        config, params = load(path, dtype)
        return build(config), params

    read.__name__ = read.__qualname__ = f"read_{getattr(load, '__name__', 'checkpoint')}"
    return read


def supports(model: Any, feature: str) -> bool:
    """Whether `model` (the bare model, not a wrapper) belongs to a family with `feature`."""
    if feature not in FEATURES:
        raise ValueError(f"unknown family feature {feature!r}; {FEATURES}")
    family = of_model(model)
    return family is not None and feature in family.features
