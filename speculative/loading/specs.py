"""Gin-configurable model and vocabulary loading for the jobs.

What to load is a cheap, hashable spec bound in gin (`speculative.ModelSpec`,
`speculative.VocabSpec`); `load_model` / `load_vocabulary` do the work. Building the specs never
touches weights, so a config can be checked (tests/test_all_gin_configs.py) without checkpoints.

Formats (ModelSpec.format):
  'gguf'    path: a .gguf file or a registry name of `speculative.loading.fetch.MODELS` (fetched on first
            use); the architecture comes from the file, so `model` stays unbound.
  'hf'      path: a Hugging Face Llama / Qwen2 / Mistral / Gemma 2 / 3 directory (config.json +
            model.safetensors or a sharded index; never pickle); architecture from config.json.
  'hf_t5'   path: a Hugging Face T5 directory (config.json + *.safetensors); architecture from it.
  't5x'     path: a T5X checkpoint directory (local or gs://); `model` gives the architecture.
  'random'  RANDOM WEIGHTS from `model.init_params(PRNGKey(seed))`: for tests and smoke runs only,
            never a trained model; every job labels it as such.
Every format but 'random' is read by the model families that list it (`checkpoints.families`:
`reader(format)`), so this module names no family; a family registered elsewhere adds its formats.

A file a loader cannot read becomes a JobError naming the role and the file (`error: target PATH:
...`). `fit_vocabulary` checks the tokenizer against each model's output size before decoding and
masks the padding ids of a model table padded past the tokenizer (`PaddingMasked`).

A draft that is not a separate model is a `speculative.DraftSpec`; its kinds, their checks and
builders live in `speculative.drafts.registry` (DraftSpec is defined there and re-exported here),
and `build_draft` builds one for the fitted target.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any

import gin
import jax
import jax.numpy as jnp

from speculative import checkpoints as checkpoints  # registers every family
from speculative import vocab
from speculative.checkpoints import best, families
from speculative.checkpoints import sharded as sharded_checkpoints
from speculative.decoding.drafter import Drafter
from speculative.drafts import registry
from speculative.drafts.registry import DraftSpec  # speculative.DraftSpec; `ml.DraftSpec` too
from speculative.errors import (
    LOADER_ERRORS,
    MALFORMED_ERRORS,
    JobError,
    check_path,
    check_slot,
    loader_error,
    strip_path,
)
from speculative.loading import fetch
from speculative.models import precision
from speculative.models.base import LanguageModel
from speculative.models.padding import PaddingMasked

log = logging.getLogger(__name__)

# The formats the registered families read (`checkpoints.families.reader`), and random weights.
FORMATS = (*families.formats(), "random")
# Formats read shard by shard onto a mesh, each host reading only its slices:
# (path, config, partitioner, role, dtype) -> placed params.
SHARD_READERS = {"t5x": sharded_checkpoints.load_t5x_sharded}
VOCAB_KINDS = ("gguf", "hf", "sentencepiece", "byte")


@gin.configurable(module="speculative")
@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Which model to load. `model` is an unloaded model object (e.g. `%MODEL` of a model gin file)."""

    format: str = gin.REQUIRED
    path: str | None = None
    model: Any = None
    dtype: str = "float32"
    seed: int = 0
    # A draft's output head over this many ids (`drafts.shortlist.for_prompts`: the Python
    # standard library's most frequent ids plus the job's prompt ids and stop ids); 0: all ids.
    # Exact, and a cheaper draft step; decoder-only drafts (`models.decoder.restrict_head`).
    shortlist: int = 0
    # A draft's tokens proposed by prompt lookup, this many per draft-model call, and verified by
    # the draft model in one call (`drafts.staged`, staged drafting; exact); 0: one call a token.
    staged_lookahead: int = 0
    # 'int8': a draft's projection and head kernels stored as int8 with per-channel scales, its
    # rows quantised per call (`models.int8`): half the bytes a bfloat16 step streams, and exact
    # like any draft (the rule sees the q it samples from). '': the weights in `dtype`. Drafts of
    # the decoder-only families only: a target's is refused (it would change the distribution
    # the output follows).
    quantize: str = ""


@gin.configurable(module="speculative")
@dataclasses.dataclass(frozen=True)
class VocabSpec:
    """Which vocabulary: 'gguf' (path or registry name), 'hf' (a Hugging Face model directory or
    its tokenizer.json), 'sentencepiece' (a .model file, T5's extra ids), or 'byte' (ByT5's byte
    vocabulary, no file)."""

    kind: str = gin.REQUIRED
    path: str | None = None
    extra_ids: int = 100


# What each spec is, as a slot bound to the wrong kind of spec says (`errors.check_slot`).
SPEC_KINDS = {
    ModelSpec: "a model's weights: format and path",
    DraftSpec: "a draft that is not a model: prompt lookup, n-grams, layer skip, a feature head",
    VocabSpec: "a tokenizer",
}


@dataclasses.dataclass(frozen=True)
class Loaded:
    """A model with its weights. description says where the weights came from (for outputs).
    For a draft, `model` may be a `Drafter` (a DraftSpec's) and `params` its params."""

    model: Any
    params: Any
    description: str

    @property
    def is_model(self) -> bool:
        """True for a separate draft (or target) model, a LanguageModel (padding-masked or not);
        False for a Drafter, such as a DraftSpec's."""
        return isinstance(self.model, LanguageModel) and not isinstance(self.model, Drafter)


def where(spec: ModelSpec | VocabSpec) -> str:
    """The path a spec reads (what one-line errors name), or what stands in for one."""
    if spec.path:
        return str(spec.path)
    return "(random weights)" if isinstance(spec, ModelSpec) else f"({spec.kind} vocabulary)"


def resolved(spec: ModelSpec | DraftSpec, role: str = "model") -> ModelSpec | DraftSpec:
    """spec with dtype 'auto' resolved for this machine (`models.precision`, logged once) and a
    training run's best checkpoint read where its path is the run's directory (format 't5x';
    `checkpoints.best`): what is loaded and what outputs record agree."""
    if not isinstance(spec, ModelSpec):
        return spec
    if spec.dtype == precision.AUTO:
        chosen = precision.resolve_dtype(spec.dtype, has_route=not is_encoder_decoder(spec))
        spec = dataclasses.replace(spec, dtype=chosen)
    if spec.format != "t5x" or not isinstance(spec.path, str):
        return spec
    try:
        path = best.resolve(spec.path)
    except ValueError as e:
        record = os.path.join(spec.path, best.BEST)
        raise JobError(strip_path(str(e), record), role=role, path=record) from e
    return dataclasses.replace(spec, path=path)


def _gguf_path(role: str, path: Any) -> str:
    if isinstance(path, str) and path in fetch.MODELS:
        return str(fetch.ensure_model(path))
    return check_path(role, "format 'gguf'", path)


def validate_model_spec(
    spec: ModelSpec | DraftSpec, role: str, slot: str | None = None, model_only: bool = False
) -> None:
    """Raises JobError for a spec that cannot be loaded (checked before any weight is read).
    model_only: the slot takes a ModelSpec alone (a target's; a draft's takes a DraftSpec too);
    a spec of a kind the slot does not take is refused naming `slot` (the config field; default:
    the role)."""
    takes = (ModelSpec,) if model_only else (ModelSpec, DraftSpec)
    check_slot(spec, slot or role, role, takes, SPEC_KINDS)
    if isinstance(spec, DraftSpec):
        registry.validate(spec, role)
        return
    known = (*families.formats(), "random")
    if spec.format not in known:
        raise JobError(f"{role}: unknown ModelSpec.format {spec.format!r}; known: {known}")
    try:
        if spec.dtype != precision.AUTO:
            jnp.dtype(spec.dtype)
    except TypeError as e:
        raise JobError(
            f"{role}: unknown dtype {spec.dtype!r} (float32, bfloat16, or 'auto': bfloat16 where "
            "the machine runs it faster)"
        ) from e
    check_quantization(spec, role)
    check_draft_forms(spec, role)
    needs_model = spec.format == "random" or families.needs_model(spec.format)
    if needs_model and not hasattr(spec.model, "init_params"):
        raise JobError(f"{role}: format {spec.format!r} needs ModelSpec.model (e.g. %MODEL)")
    if not needs_model and spec.model is not None:
        raise JobError(
            f"{role}: format {spec.format!r} reads the architecture from the checkpoint; "
            "leave ModelSpec.model unbound"
        )
    if spec.format == "random" and spec.path is not None:
        raise JobError(f"{role}: format 'random' takes no path (got {spec.path!r})")
    readers = families.reading(spec.format)
    if needs_model and readers and families.of_model(spec.model) not in readers:
        wanted = " or ".join(f"{f.model.__name__} (family {f.name!r})" for f in readers)
        raise JobError(
            f"{role}: format {spec.format!r} needs a {wanted} model, got {type(spec.model).__name__}"
        )
    if spec.format not in ("gguf", "random"):  # a GGUF path may be a registry name (fetched)
        check_path(role, f"format {spec.format!r}", spec.path)
    resolved(spec, role)  # a training run's best-checkpoint record is checked here, before loading
    if spec.format == "gguf" and not (isinstance(spec.path, str) and spec.path in fetch.MODELS):
        check_path(role, "format 'gguf'", spec.path)


def is_encoder_decoder(spec: ModelSpec) -> bool:
    """Whether a spec's model is an encoder-decoder, known without reading its weights."""
    if spec.model is None:  # the checkpoint says the architecture: ask the families reading it
        return all(f.model.is_encoder_decoder for f in families.reading(spec.format))
    return bool(spec.model.is_encoder_decoder)


def describe(spec: ModelSpec | DraftSpec) -> str:
    """One line naming the weights (or the draft kind and options); random weights are labelled
    loudly."""
    if isinstance(spec, DraftSpec):
        return registry.describe(spec)
    spec = resolved(spec)
    head = f", head shortlist {spec.shortlist}" if spec.shortlist else ""
    if spec.quantize:
        head += f", {spec.quantize} weights"
    if spec.staged_lookahead:
        head += f", staged by prompt lookup ({spec.staged_lookahead} a call)"
    if spec.format == "random":
        model = with_dtype(spec.model, spec.dtype)
        return f"RANDOM WEIGHTS (seed {spec.seed}, not a trained model): {model!r}{head}"
    extra = f" as {spec.model!r}" if spec.model is not None else ""
    return f"{spec.format}:{spec.path} ({spec.dtype}){extra}{head}"


QUANTIZATIONS = ("", "int8")


def check_draft_forms(spec: ModelSpec, role: str) -> None:
    """JobError for a shortlist or staged lookahead that is not an int >= 0, or either on a
    target (they are a draft's forms: a target's would be ignored)."""
    for name in ("shortlist", "staged_lookahead"):
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise JobError(f"{name} must be an int >= 0, got {value!r}", role=role)
        if value and role == "target":
            message = f"{name} is a draft's option: the target is decoded as it is (ignored)"
            raise JobError(message, role=role)


def check_quantization(spec: Any, role: str, partitioner: Any = None) -> None:
    """JobError for a ModelSpec.quantize this project does not know, on the target, or beside a
    partitioner (a mesh); a spec that is no ModelSpec asks for none."""
    kind = getattr(spec, "quantize", "") if isinstance(spec, ModelSpec) else ""
    if kind and role == "target":
        raise JobError(
            "quantize is a draft's option: int8 target weights would make another model the "
            "target (its outputs would follow the int8 model, not these weights)",
            role=role,
        )
    if kind not in QUANTIZATIONS:
        raise JobError(
            f"unknown ModelSpec.quantize {kind!r}; known: 'int8', or '' for none", role=role
        )
    if kind and partitioner is not None:
        raise JobError(
            "quantize='int8' runs on one device: the partitioning rules have no axes for an "
            "int8 kernel's scales (unbind PARTITIONER, or the draft's quantize)",
            role=role,
        )


def build_draft(spec: DraftSpec, target: Loaded, role: str = "draft") -> Loaded:
    """The drafter a DraftSpec names (`drafts.registry`), built for the fitted (vocabulary-checked)
    target."""
    drafter, params = registry.build(spec, target.model, target.params, role)
    return Loaded(drafter, params, registry.describe(spec))


def with_dtype(model: Any, dtype: str) -> Any:
    """`model` computing in `dtype`: ModelSpec.dtype is the one knob for weights, activations and
    caches (a GGUF or HF config is built with it already). Logits and probabilities stay float32
    whatever it is (docs/design.md §1)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "dtype", dtype) == dtype:
        return model
    return type(model)(dataclasses.replace(config, dtype=jnp.dtype(dtype).name))


def _cast(params: Any, dtype: Any) -> Any:
    return jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, params
    )


def load_model(
    spec: ModelSpec, role: str = "model", partitioner: Any = None, slot: str | None = None
) -> Loaded:
    """Reads the weights a spec names. role ('target', 'draft') prefixes error messages.

    With a `partitioning.Partitioner` every parameter is placed on its shards by the role's rules;
    a T5X checkpoint is then read shard by shard (`sharded_checkpoints.load_t5x_sharded`), never
    whole. A mesh that does not divide the model is a JobError naming the config field; a spec
    that is no ModelSpec, one naming `slot` (the config field; default: the role).
    """
    validate_model_spec(spec, role, slot, model_only=True)
    chosen = resolved(spec, role)
    if chosen.path != spec.path:
        log.info(
            f"{role}: {spec.path} is a training run: reading its best checkpoint, {chosen.path}"
        )
    spec = chosen
    start = time.perf_counter()
    try:
        if partitioner is None:
            model, params = _read_weights(spec, role)
        else:
            model, params = _read_sharded(spec, role, partitioner)
    except JobError:
        raise
    except LOADER_ERRORS + MALFORMED_ERRORS as e:
        raise loader_error(e, role, where(spec)) from e
    count = sum(x.size for x in jax.tree.leaves(params))
    log.info(
        f"{role}: {describe(spec)}: {count / 1e6:.1f}M params in {time.perf_counter() - start:.1f}s"
    )
    return Loaded(model, params, describe(spec))


def _read_sharded(spec: ModelSpec, role: str, partitioner: Any) -> tuple[LanguageModel, Any]:
    """(model, params placed by `partitioner`'s rules for `role`) of a validated spec."""
    place_role = "draft" if role == "draft" else "target"
    if spec.model is not None:  # the architecture is known: check the mesh before reading
        _check_mesh(partitioner, spec.model, place_role, role)
    if spec.format in SHARD_READERS:
        dtype = jnp.dtype(spec.dtype)
        read = SHARD_READERS[spec.format]
        params = read(spec.path, spec.model.config, partitioner, place_role, dtype)
        return with_dtype(spec.model, spec.dtype), params
    model, params = _read_weights(spec, role)
    _check_mesh(partitioner, model, place_role, role)
    return model, partitioner.place_params(model, params, place_role)


def _check_mesh(partitioner: Any, model: Any, place_role: str, role: str) -> None:
    try:
        partitioner.rules(model, place_role)
    except ValueError as e:
        raise JobError(f"mesh: {e}", role=role) from e


def _read_weights(spec: ModelSpec, role: str) -> tuple[LanguageModel, Any]:
    """(model, params) of a validated spec: random weights, or the reader of its format
    (`checkpoints.families.reader`; the file, or ModelSpec.model for 't5x', says the family)."""
    dtype = jnp.dtype(spec.dtype)
    if spec.format == "random":
        model = with_dtype(spec.model, spec.dtype)
        return model, _cast(model.init_params(jax.random.PRNGKey(spec.seed)), dtype)
    path = _gguf_path(role, spec.path) if spec.format == "gguf" else spec.path
    model, params = families.reader(spec.format)(path, dtype, spec.model)
    return with_dtype(model, spec.dtype), params


def validate_vocab_spec(spec: VocabSpec, role: str, slot: str | None = None) -> None:
    """Raises JobError for a vocabulary that cannot be loaded; slot: as `validate_model_spec`."""
    check_slot(spec, slot or role, role, (VocabSpec,), SPEC_KINDS)
    if spec.kind not in VOCAB_KINDS:
        raise JobError(f"{role}: unknown VocabSpec.kind {spec.kind!r}; known: {VOCAB_KINDS}")
    if spec.kind == "sentencepiece":
        check_path(role, "a SentencePiece vocabulary", spec.path)
    if spec.kind == "hf":
        check_path(role, "a Hugging Face vocabulary (model directory or tokenizer.json)", spec.path)
    if spec.kind == "gguf" and not (isinstance(spec.path, str) and spec.path in fetch.MODELS):
        check_path(role, "a GGUF vocabulary", spec.path)


def load_vocabulary(
    spec: VocabSpec, role: str = "vocabulary", slot: str | None = None
) -> vocab.Vocabulary:
    """The tokenizer a spec names; a file it cannot read is a JobError naming role and path."""
    validate_vocab_spec(spec, role, slot)
    try:
        if spec.kind == "byte":
            return vocab.ByteVocabulary(extra_ids=spec.extra_ids)
        if spec.kind == "sentencepiece":
            return vocab.SentencePieceVocabulary(
                fetch.local_copy(spec.path), extra_ids=spec.extra_ids
            )
        if spec.kind == "hf":
            return vocab.from_hf(spec.path)
        return vocab.from_gguf(_gguf_path(role, spec.path))
    except JobError:
        raise
    except LOADER_ERRORS + MALFORMED_ERRORS as e:
        raise loader_error(e, role, where(spec)) from e


def check_draft_vocabulary(spec: VocabSpec | None, target_vocabulary: vocab.Vocabulary) -> None:
    """Refuses a draft whose configured vocabulary differs from the target's (no-op when None)."""
    if spec is None:
        return
    try:
        vocab.check_compatible(load_vocabulary(spec, "draft vocabulary"), target_vocabulary)
    except ValueError as e:
        raise JobError(str(e), role="draft vocabulary", path=where(spec)) from e


# ------------------------------------------------------------------------------------------------
# Vocabulary size against the models' output size.


def fit_vocabulary(
    vocabulary: vocab.Vocabulary, vocab_path: str, models: dict[str, tuple[Loaded, str]]
) -> tuple[dict[str, Loaded], dict[str, Any]]:
    """Checks the tokenizer against every model's output size; masks padding ids when needed.

    models: role -> (loaded model, its path). Raises JobError naming both sizes when the
    tokenizer can produce ids a model has no output for. Ids past the tokenizer (a model table
    padded to a round size, or "[PAD7]" pieces) are masked out of every model (`PaddingMasked`)
    and described in the returned dict ({} when nothing is masked).
    """
    used = vocab.used_size(vocabulary)
    sizes = {role: loaded.model.vocab_size for role, (loaded, _) in models.items()}
    for role, (_, path) in models.items():
        if sizes[role] < used:
            raise JobError(
                f"the model has {sizes[role]} output ids but the vocabulary {vocab_path} has "
                f"{used} tokens: the tokenizer can produce ids the model does not have",
                role=role,
                path=path,
            )
    if all(size == used for size in sizes.values()):
        return {role: loaded for role, (loaded, _) in models.items()}, {}
    width = min(sizes.values())
    fitted = {
        role: dataclasses.replace(loaded, model=PaddingMasked(loaded.model, used, width))
        for role, (loaded, _) in models.items()
    }
    info = {
        "vocabulary_tokens": used,
        "model_output_ids": sizes,
        "masked_ids": [used, max(sizes.values())],
    }
    log.info(
        f"vocabulary: {used} tokens, model output ids {sizes}: ids {used}..."
        f"{max(sizes.values()) - 1} are padding, masked out of every distribution (never produced)"
    )
    return fitted, info
