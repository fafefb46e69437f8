"""Gin-configurable model and vocabulary loading for the jobs.

What to load is a cheap, hashable spec bound in gin (`speculative.ModelSpec`,
`speculative.VocabSpec`); `load_model` / `load_vocabulary` do the work. Building the specs never
touches weights, so a config can be checked (tests/test_all_gin_configs.py) without checkpoints.

Formats (ModelSpec.format):
  'gguf'    path: a .gguf file or a registry name of `speculative.fetch.MODELS` (fetched on first
            use); the architecture comes from the file, so `model` stays unbound.
  'hf_t5'   path: a Hugging Face T5 directory (config.json + *.safetensors); architecture from it.
  't5x'     path: a T5X checkpoint directory (local or gs://); `model` gives the architecture.
  'random'  RANDOM WEIGHTS from `model.init_params(PRNGKey(seed))`: for tests and smoke runs only,
            never a trained model; every job labels it as such.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import gin
import jax
import jax.numpy as jnp

from speculative import checkpoints, fetch, vocab
from speculative.errors import JobError
from speculative.models import decoder, t5
from speculative.models.base import LanguageModel

FORMATS = ("gguf", "hf_t5", "t5x", "random")
VOCAB_KINDS = ("gguf", "sentencepiece", "byte")


@gin.configurable(module="speculative")
@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Which model to load. `model` is an unloaded model object (e.g. `%MODEL` of a model gin file)."""

    format: str = gin.REQUIRED
    path: str | None = None
    model: Any = None
    dtype: str = "float32"
    seed: int = 0


@gin.configurable(module="speculative")
@dataclasses.dataclass(frozen=True)
class VocabSpec:
    """Which vocabulary: 'gguf' (path or registry name), 'sentencepiece' (a .model file, T5's
    extra ids), or 'byte' (ByT5's byte vocabulary, no file)."""

    kind: str = gin.REQUIRED
    path: str | None = None
    extra_ids: int = 100


@dataclasses.dataclass(frozen=True)
class Loaded:
    """A model with its weights. description says where the weights came from (for outputs)."""

    model: LanguageModel
    params: Any
    description: str


def _is_remote(path: str) -> bool:
    return "://" in path


def _check_path(role: str, what: str, path: Any) -> str:
    if path is None or path is gin.REQUIRED or path == "":
        raise JobError(f"{role}: {what} needs a checkpoint path; none is bound")
    path = os.fspath(path)
    if not _is_remote(path) and not os.path.exists(path):
        raise JobError(f"{role}: checkpoint path {path!r} does not exist")
    return path


def _gguf_path(role: str, path: Any) -> str:
    if isinstance(path, str) and path in fetch.MODELS:
        return str(fetch.ensure_model(path))
    return _check_path(role, "format 'gguf'", path)


def validate_model_spec(spec: ModelSpec, role: str) -> None:
    """Raises JobError for a spec that cannot be loaded (checked before any weight is read)."""
    if not isinstance(spec, ModelSpec):
        raise JobError(f"{role}: expected a speculative.ModelSpec, got {type(spec).__name__}")
    if spec.format not in FORMATS:
        raise JobError(f"{role}: unknown ModelSpec.format {spec.format!r}; known: {FORMATS}")
    try:
        jnp.dtype(spec.dtype)
    except TypeError as e:
        raise JobError(f"{role}: unknown dtype {spec.dtype!r}") from e
    needs_model = spec.format in ("t5x", "random")
    if needs_model and not hasattr(spec.model, "init_params"):
        raise JobError(f"{role}: format {spec.format!r} needs ModelSpec.model (e.g. %MODEL)")
    if not needs_model and spec.model is not None:
        raise JobError(
            f"{role}: format {spec.format!r} reads the architecture from the checkpoint; "
            "leave ModelSpec.model unbound"
        )
    if spec.format == "random" and spec.path is not None:
        raise JobError(f"{role}: format 'random' takes no path (got {spec.path!r})")
    if spec.format == "t5x" and not isinstance(spec.model, t5.T5):
        raise JobError(f"{role}: format 't5x' needs a t5.T5 model, got {type(spec.model).__name__}")
    if spec.format in ("hf_t5", "t5x"):
        _check_path(role, f"format {spec.format!r}", spec.path)
    if spec.format == "gguf" and not (isinstance(spec.path, str) and spec.path in fetch.MODELS):
        _check_path(role, "format 'gguf'", spec.path)


def describe(spec: ModelSpec) -> str:
    """One line naming the weights; random weights are labelled loudly."""
    if spec.format == "random":
        return f"RANDOM WEIGHTS (seed {spec.seed}, not a trained model): {spec.model!r}"
    extra = f" as {spec.model!r}" if spec.model is not None else ""
    return f"{spec.format}:{spec.path} ({spec.dtype}){extra}"


def _cast(params: Any, dtype: Any) -> Any:
    return jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, params
    )


def load_model(spec: ModelSpec, role: str = "model") -> Loaded:
    """Reads the weights a spec names. role ('target', 'draft') prefixes error messages."""
    validate_model_spec(spec, role)
    dtype = jnp.dtype(spec.dtype)
    start = time.perf_counter()
    if spec.format == "random":
        model = spec.model
        params = _cast(model.init_params(jax.random.PRNGKey(spec.seed)), dtype)
    elif spec.format == "gguf":
        config, params = checkpoints.load_gguf(_gguf_path(role, spec.path), dtype=dtype)
        model = decoder.DecoderLM(config)
    elif spec.format == "hf_t5":
        config, params = checkpoints.load_hf_t5(spec.path, dtype=dtype)
        model = t5.T5(config)
    else:
        model = spec.model
        params = checkpoints.load_t5x(spec.path, model.config, dtype=dtype)
    count = sum(x.size for x in jax.tree.leaves(params))
    print(
        f"{role}: {describe(spec)}: {count / 1e6:.1f}M params in {time.perf_counter() - start:.1f}s"
    )
    return Loaded(model, params, describe(spec))


def _local_copy(path: str) -> str:
    """A local file with the contents of path; gs:// files are read once with TensorStore (its
    kvstore speaks GCS) into the cache, since SentencePiece only opens local files."""
    if not _is_remote(path):
        return path
    import hashlib

    import tensorstore as ts

    local = fetch.default_cache_dir() / "remote" / hashlib.sha256(path.encode()).hexdigest()[:16]
    local = local.with_name(local.name + "_" + os.path.basename(path))
    if not local.exists():
        directory, name = path.rsplit("/", 1)
        result = ts.KvStore.open(directory + "/").result().read(name).result()
        if result.state == "missing":
            raise JobError(f"vocabulary file {path!r} does not exist")
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f"{local.name}.{os.getpid()}.part")
        tmp.write_bytes(bytes(result.value))
        os.replace(tmp, local)
    return str(local)


def validate_vocab_spec(spec: VocabSpec, role: str) -> None:
    if not isinstance(spec, VocabSpec):
        raise JobError(f"{role}: expected a speculative.VocabSpec, got {type(spec).__name__}")
    if spec.kind not in VOCAB_KINDS:
        raise JobError(f"{role}: unknown VocabSpec.kind {spec.kind!r}; known: {VOCAB_KINDS}")
    if spec.kind == "sentencepiece":
        _check_path(role, "a SentencePiece vocabulary", spec.path)
    if spec.kind == "gguf" and not (isinstance(spec.path, str) and spec.path in fetch.MODELS):
        _check_path(role, "a GGUF vocabulary", spec.path)


def load_vocabulary(spec: VocabSpec, role: str = "vocabulary") -> vocab.Vocabulary:
    validate_vocab_spec(spec, role)
    if spec.kind == "byte":
        return vocab.ByteVocabulary(extra_ids=spec.extra_ids)
    if spec.kind == "sentencepiece":
        return vocab.SentencePieceVocabulary(_local_copy(spec.path), extra_ids=spec.extra_ids)
    return vocab.from_gguf(_gguf_path(role, spec.path))


def check_draft_vocabulary(spec: VocabSpec | None, target_vocabulary: vocab.Vocabulary) -> None:
    """Refuses a draft whose configured vocabulary differs from the target's (no-op when None)."""
    if spec is None:
        return
    try:
        vocab.check_compatible(load_vocabulary(spec, "draft vocabulary"), target_vocabulary)
    except ValueError as e:
        raise JobError(str(e)) from e
