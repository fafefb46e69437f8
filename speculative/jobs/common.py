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

from speculative import job_spmd, vocab
from speculative import model_loading as ml
from speculative.drafts import cross_vocab
from speculative.errors import JobError
from speculative.job_io import hold_output_dir
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
    target's width."""
    mesh = {} if partitioner is None else {"partitioner": partitioner}
    loaded = {"target": (ml.load_model(target, "target", **mesh), ml.where(target))}
    for role, spec in drafts:
        if is_separate_model(spec):
            loaded[role] = (ml.load_model(spec, role, **mesh), ml.where(spec))
    own = cross_vocabulary(draft_vocabulary, vocabulary) if drafts else None
    if own is not None:  # each draft model fitted to its own vocabulary, proposing through tables
        fitted, padding = ml.fit_vocabulary(
            vocabulary, ml.where(vocabulary_spec), {"target": loaded["target"]}
        )
        for role, spec in drafts:
            fitted[role] = cross_draft(
                role, spec, loaded, own, draft_vocabulary, vocabulary, fitted
            )
        return LoadedModels(fitted["target"], tuple(fitted[role] for role, _ in drafts), padding)
    fitted, padding = ml.fit_vocabulary(vocabulary, ml.where(vocabulary_spec), loaded)
    for role, spec in drafts:
        if not is_separate_model(spec):
            fitted[role] = ml.build_draft(spec, fitted["target"], role)
    return LoadedModels(fitted["target"], tuple(fitted[role] for role, _ in drafts), padding)


def cross_vocabulary(
    spec: ml.VocabSpec | None, target_vocabulary: vocab.Vocabulary
) -> vocab.Vocabulary | None:
    """The draft's own vocabulary when DRAFT_VOCABULARY differs from VOCABULARY (a
    cross-vocabulary draft, drafts/cross_vocab.py); None when it is unset or the same."""
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


def with_shortlists(
    models: LoadedModels,
    drafts: Sequence[tuple[str, Any]],
    vocabulary: vocab.Vocabulary,
    prompts: Sequence[Sequence[int]],
) -> LoadedModels:
    """Each draft with the shortlist head its spec asks for, fitted to every prompt of the job,
    and staged (prompt lookup proposing the draft model's tokens) where its spec asks."""
    shortlisted = tuple(
        ml.with_staging(ml.with_shortlist(loaded, spec, vocabulary, prompts, role), spec, role)
        for loaded, (role, spec) in zip(models.drafts, drafts)
    )
    return dataclasses.replace(models, drafts=shortlisted)


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
