"""What the infer and benchmark jobs do alike: load the target and draft(s) (vocabulary checked
and fitted, drafts that are not models built, shortlist heads), turn NaN logits into a one-line
JobError, and hold OUTPUT_DIR's lock with the compilation cache on while a job runs."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import gin
import jax
import jax.numpy as jnp

from speculative import vocab
from speculative.decoding.config import DecodeConfig
from speculative.drafts import cross_vocab
from speculative.errors import JobError
from speculative.jobs import spmd as job_spmd
from speculative.loading import draft_forms
from speculative.loading import specs as ml
from speculative.measure.memory import param_bytes, state_bytes
from speculative.models import int8
from speculative.outputs.job_io import hold_output_dir
from speculative.parallel import partitioning
from speculative.vocab import cross_tables

log = logging.getLogger(__name__)


class InputLengths:
    """For a settings group with `feature_lengths` {'inputs': n, 'targets': m}: the prompt length
    inputs are padded or cut to, and the most tokens generated per row."""

    feature_lengths: Mapping[str, int]

    @property
    def input_length(self) -> int:
        return self.feature_lengths["inputs"]

    @property
    def max_decode_len(self) -> int:
        return self.feature_lengths["targets"]


def check_required(config: Any, names: Sequence[str]) -> None:
    """Raises JobError naming the first of `names` the gin config left `%gin.REQUIRED`."""
    for name in names:
        if getattr(config, name) is gin.REQUIRED:
            raise JobError(f"speculative.{type(config).__name__}.{name} is required")


def group(cls: type, config: Any, **overrides: Any) -> Any:
    """A settings group (a dataclass) from the gin config's fields of the same names, with
    `overrides` in place of some: settings are read from the config in one place."""
    names = [f.name for f in dataclasses.fields(cls) if f.init and f.name not in overrides]
    return cls(**{name: getattr(config, name) for name in names}, **overrides)


@dataclasses.dataclass(frozen=True)
class LoadedModels:
    """The fitted target and drafts (in the order their specs were given) and the padding ids
    masked out of every model ({} when none, see `model_loading.fit_vocabulary`)."""

    target: ml.Loaded
    drafts: tuple[ml.Loaded, ...]
    vocab_padding: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def is_separate_model(spec: Any) -> bool:
    """Whether a draft spec names a model of its own (a ModelSpec, loaded like the target), not a
    DraftSpec (a drafter built from the fitted target: n-gram, prompt lookup, layer skip)."""
    return not isinstance(spec, ml.DraftSpec)


def model_of(loaded: ml.Loaded) -> Any:
    """A loaded draft's model, or None for a `Drafter` (no prefill, weights or cache of its own)."""
    return loaded.model if loaded.is_model else None


def load_models(
    target: ml.ModelSpec,
    drafts: Sequence[tuple[str, Any]],
    vocabulary: vocab.Vocabulary,
    vocabulary_spec: ml.VocabSpec,
    draft_vocabulary: ml.VocabSpec | None,
    partitioner: Any = None,
) -> LoadedModels:
    """The target and drafts ((role, spec) pairs), checked against the vocabulary, padding ids
    masked out; on their shards with a partitioner. A DraftSpec's drafter is built for the fitted
    target's width; a draft model whose own vocabulary (`draft_vocabulary_of`) differs from the
    target's proposes through cross-vocabulary tables, the others are fitted to the target's."""
    mesh = {} if partitioner is None else {"partitioner": partitioner}
    loaded = {"target": (ml.load_model(target, "target", **mesh), ml.where(target))}
    for role, spec in drafts:
        if is_separate_model(spec):
            loaded[role] = (ml.load_model(spec, role, **mesh), ml.where(spec))
    own_specs = {role: draft_vocabulary_of(spec, draft_vocabulary) for role, spec in drafts}
    # each vocabulary read once (variants of a benchmark share their drafts' checkpoints)
    read = {s: cross_vocabulary(s, vocabulary) for s in dict.fromkeys(own_specs.values())}
    own = {role: read[own_specs[role]] for role, _ in drafts}
    same = {role: v for role, v in loaded.items() if own.get(role) is None}
    fitted, padding = ml.fit_vocabulary(vocabulary, ml.where(vocabulary_spec), same)
    for role, spec in drafts:
        if own[role] is not None:  # fitted to its own vocabulary, proposing through tables
            fitted[role] = cross_draft(
                role, spec, loaded, own[role], own_specs[role], vocabulary, fitted
            )
        elif not is_separate_model(spec):
            fitted[role] = ml.build_draft(spec, fitted["target"], role)
    return LoadedModels(fitted["target"], tuple(fitted[role] for role, _ in drafts), padding)


def draft_vocabulary_of(spec: Any, draft_vocabulary: ml.VocabSpec | None) -> ml.VocabSpec | None:
    """A draft's own vocabulary: with DRAFT_VOCABULARY set, a draft model whose checkpoint carries
    a tokenizer (a GGUF file, a Hugging Face directory) has that one, so that drafts of two
    tokenizers can be variants of one benchmark; any other draft has DRAFT_VOCABULARY."""
    if draft_vocabulary is None or not is_separate_model(spec):
        return draft_vocabulary
    if getattr(spec, "format", None) in ("gguf", "hf") and spec.path is not None:
        return ml.VocabSpec(spec.format, spec.path)
    return draft_vocabulary


def cross_vocabulary(
    spec: ml.VocabSpec | None, target_vocabulary: vocab.Vocabulary
) -> vocab.Vocabulary | None:
    """The draft's own vocabulary when it differs from the target's (a cross-vocabulary draft,
    drafts/cross_vocab.py); None when it is unset or the same."""
    if spec is None:
        return None
    own = ml.load_vocabulary(spec, "draft vocabulary")
    try:
        vocab.check_compatible(own, target_vocabulary)
    except ValueError as e:
        log.info(f"draft vocabulary {ml.where(spec)}: {e}: the draft proposes across vocabularies")
        return own
    return None


def cross_draft(
    role: str,
    spec: Any,
    loaded: Mapping[str, tuple[ml.Loaded, str]],
    own: vocab.Vocabulary,
    own_spec: ml.VocabSpec,
    vocabulary: vocab.Vocabulary,
    fitted: Mapping[str, ml.Loaded],
) -> ml.Loaded:
    """A draft model with its own vocabulary as a `CrossVocabDrafter` for the fitted target:
    one-line JobErrors for a draft that is not a model, staged or shortlisted, or whose tables
    cannot be built (a target token the draft cannot spell, say)."""
    if not is_separate_model(spec):
        raise JobError(
            "DRAFT_VOCABULARY differs from VOCABULARY, but this draft is a DraftSpec (it proposes "
            "the target's own tokens): only a draft model may have its own vocabulary",
            role=role,
        )
    if getattr(spec, "shortlist", 0) or getattr(spec, "staged_lookahead", 0):
        raise JobError(
            "a draft with its own vocabulary (DRAFT_VOCABULARY) cannot be shortlisted or staged",
            role=role,
        )
    draft = ml.fit_vocabulary(own, ml.where(own_spec), {role: loaded[role]})[0][role]
    target = fitted["target"].model
    try:
        tables = cross_tables.build_tables(
            own, vocabulary, draft.model.vocab_size, target.vocab_size
        )
        drafter, params = cross_vocab.make_drafter(draft.model, draft.params, tables)
    except ValueError as e:
        raise JobError(f"cross-vocabulary tables: {e}", role="draft vocabulary") from e
    log.info(cross_tables.describe(tables, vocab.used_size(vocabulary)))
    return ml.Loaded(drafter, params, draft.description)


def cross_draft_bytes(
    drafter: cross_vocab.CrossVocabDrafter,
    mesh_shape: Mapping[str, int],
    batch_size: int,
    input_len: int,
    max_decode_len: int,
    gamma: int,
    param_dtype: Any,
) -> dict[str, int]:
    """Bytes per device of a draft with its own tokenizer: "draft params" (its weights in
    param_dtype, placed by the draft rules), "draft cache" (its decode state for B = batch_size
    rows of `drafter.cache_length`: the prompt's draft tokens (K * input_len, at most the fitted
    prompts' longest spelling, `CrossVocabDrafter.fit_prompts`) + K * (max_decode_len + gamma +
    2) + K + gamma slots, capped at the draft model's context) and "tables" (int32 to_target [Vd], to_draft [Vt],
    spelling [Vt, K] and spelling_lengths [Vt], replicated). The cache is `state_bytes`'s at
    that length, as any draft's."""
    model, rules = drafter.model, partitioning.DRAFT_RULES
    prompt = {"prompt": jax.ShapeDtypeStruct((batch_size, input_len), jnp.int32)}
    config = DecodeConfig(max_decode_len, (0,), gamma=gamma)
    args = (batch_size, input_len, max_decode_len, gamma)
    length = drafter.cache_length(prompt, config)
    target = drafter.target_vocab_size
    return {
        "draft params": param_bytes(model, rules, mesh_shape, param_dtype),
        "draft cache": state_bytes(model, rules, mesh_shape, *args, cache_length=length),
        "tables": 4 * (model.vocab_size + target * (drafter.width + 2)),
    }


def cross_draft_parts(
    loaded: ml.Loaded | None,
    mesh_shape: Mapping[str, int] | None,
    batch_size: int,
    input_len: int,
    max_decode_len: int,
    gamma: int,
    param_dtype: Any,
) -> dict[str, int] | None:
    """`cross_draft_bytes` of a loaded draft with its own tokenizer (the jobs' memory lines count
    it with `memory.job_report(draft_parts=...)`), else None (no draft, or any other draft)."""
    if loaded is None or not isinstance(loaded.model, cross_vocab.CrossVocabDrafter):
        return None
    mesh = dict(mesh_shape or {"data": 1, "model": 1})
    args = (batch_size, input_len, max_decode_len, max(gamma, 1))
    return cross_draft_bytes(loaded.model, mesh, *args, param_dtype)


def int8_draft_parts(loaded: ml.Loaded | None) -> dict[str, int] | None:
    """{"draft params": bytes as loaded} for a draft with int8 weights (`ModelSpec.quantize`, one
    device: the memory lines' shape-based count would take every kernel in the model's dtype),
    else None."""
    if loaded is None or not int8.is_quantized(loaded.params):
        return None
    return {"draft params": sum(x.nbytes for x in jax.tree.leaves(loaded.params))}


def prepare_drafts(
    models: LoadedModels,
    drafts: Sequence[tuple[str, Any]],
    vocabulary: vocab.Vocabulary,
    prompts: Sequence[Sequence[int]],
) -> LoadedModels:
    """Each draft in the form its spec asks for (`loading.draft_forms`, in this order: a shortlist
    head fitted to every prompt of the job, int8 weights, staging); a draft with its own tokenizer
    has its cache sized for the job's prompts (`fit_cross_prompts`)."""
    prepared = []
    for loaded, (role, spec) in zip(models.drafts, drafts):
        loaded = draft_forms.with_shortlist(loaded, spec, vocabulary, prompts, role)
        loaded = draft_forms.with_quantization(loaded, spec, role)
        loaded = draft_forms.with_staging(loaded, spec, role)
        prepared.append(fit_cross_prompts(loaded, prompts))
    return dataclasses.replace(models, drafts=tuple(prepared))


def fit_cross_prompts(loaded: ml.Loaded, prompts: Sequence[Sequence[int]]) -> ml.Loaded:
    """A draft with its own tokenizer with its cache's prompt part sized for the job's prompts
    (`CrossVocabDrafter.fit_prompts`: their longest spelling, not K per prompt token); any other
    draft unchanged."""
    if not isinstance(loaded.model, cross_vocab.CrossVocabDrafter):
        return loaded
    return dataclasses.replace(loaded, model=loaded.model.fit_prompts(prompts))


def param_dtype(loaded: ml.Loaded) -> Any:
    return jax.tree.leaves(loaded.params)[0].dtype


def nan_role(error: BaseException) -> str:
    """Whose logits were NaN ("target" or "draft"; `decoding.NaNLogitsError` says)."""
    return "draft" if getattr(error, "role", "target") == "draft" else "target"


def nan_error(error: BaseException, where: str, remedy: str, paths: Mapping[str, str]) -> JobError:
    """The one-line JobError for NaN logits `where` ("while decoding input(s) 3, 4"); paths: what
    to name for the target's and the draft's role."""
    role = nan_role(error)
    return JobError(
        f"NaN logits {where}: corrupt weights, or a dtype too narrow for the model ({remedy})",
        role=role,
        path=paths[role],
    )


@contextlib.contextmanager
def locked_output_dir(
    output_dir: str, cache_setting: str | None, lock: bool = True
) -> Iterator[job_spmd.CacheStats]:
    """OUTPUT_DIR's lock (when `lock`: the writer's; a lock object on a store, see
    `job_io.hold_output_dir`) and JAX's compilation cache (COMPILATION_CACHE_DIR, 'auto' beside a
    local OUTPUT_DIR) while the block runs; yields the cache's stats."""
    cache_dir = job_spmd.cache_dir(cache_setting)
    held = hold_output_dir(output_dir) if lock else contextlib.nullcontext()
    with held, job_spmd.compilation_cache(cache_dir) as cache:
        yield cache
