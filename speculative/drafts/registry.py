"""Draft kinds: what a `speculative.DraftSpec` (configs/drafts/*.gin) may name.

A draft that is not a separate model is one `DraftKind`: its name (the DraftSpec's `kind`), a
one-line description, a check of the spec made before anything is loaded, the line that describes
it in outputs, and the builder of its `Drafter` for the fitted target. The jobs reach drafts only
through this module (by way of `model_loading.build_draft`); nothing else names a kind, and
`names()` lists them by name.

Adding a draft kind is one file and one `register(...)` statement:

  1. Write speculative/drafts/<name>.py: the drafter (a `decoding.StatelessDrafter`, or a
     `decoding.ModelDrafter` for a model-shaped draft), its module functions

         _build(spec, target_model, target_params, role) -> (drafter, params)
         _validate(spec, role) -> None; raises JobError (optional)
         _describe(spec) -> one line for outputs (optional; default: the name)

     and, at the bottom, the kind (`DraftKind`'s fields in order: name, description, build,
     validate, describe):

         DESCRIPTION = "one line for --help and the docs"
         registry.register(registry.DraftKind("<name>", DESCRIPTION, _build, _validate, _describe))

     `build` gets the fitted target: a model whose padding ids are masked has them masked in its
     `vocab_size`, and `models.padding.split` gives the bare model and the function that masks a
     model derived from it alike. Raise `JobError(..., role=role)` for what the user can fix.
     What the drafter can do (token trees, target features, optional stats) is declared on its
     class (`decoding.Drafter.grows_trees` and the rest), the one place the loop and the jobs
     read it; a kind declares nothing of its own.
  2. Nothing else: speculative/drafts/__init__.py imports every module of the package, so the
     file registers its kind whenever the package is imported. A kind defined outside the
     package (a fork's, a test's) registers when its module is imported, before the job builds
     its draft.
  3. A config: configs/drafts/<name>.gin binding `speculative.DraftSpec.kind = '<name>'` and the
     DraftSpec fields the kind reads.

Importing this module (or anything under `speculative.drafts`) loads the package first, so the
built-in kinds are always registered.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import gin

from speculative.errors import JobError


@gin.configurable(module="speculative")
@dataclasses.dataclass(frozen=True)
class DraftSpec:
    """A draft that is not a separate model (configs/drafts/*.gin), accepted wherever a draft
    ModelSpec is. `kind` is a registered draft kind (`speculative.drafts.registry.names()`); the
    other fields are the options the kinds read (n-gram lengths of a lookup, a tables file, a
    number of layers, a trained head's checkpoint directory). Built after `fit_vocabulary`, from
    the fitted target (`build_draft`).
    """

    kind: str = gin.REQUIRED
    max_ngram: int = 3
    min_ngram: int = 1
    tables: str | None = None
    num_layers: int = 1
    checkpoint: str | None = None


def _no_checks(spec: DraftSpec, role: str) -> None:
    del spec, role


def _kind_name(spec: DraftSpec) -> str:
    return spec.kind


@dataclasses.dataclass(frozen=True)
class DraftKind:
    """One draft kind (see the module doc). build: (spec, target_model, target_params, role) ->
    (drafter, its params); validate: (spec, role), raises JobError; describe: spec -> one line."""

    name: str
    description: str
    build: Callable[[DraftSpec, Any, Any, str], tuple[Any, Any]]
    validate: Callable[[DraftSpec, str], None] = _no_checks
    describe: Callable[[DraftSpec], str] = _kind_name


_KINDS: dict[str, DraftKind] = {}


def register(kind: DraftKind) -> DraftKind:
    """Adds a kind (returned, so a module may keep it). A second kind of the same name is a
    ValueError; registering the same kind again is a no-op."""
    known = _KINDS.get(kind.name)
    if known is not None and known != kind:
        raise ValueError(f"draft kind {kind.name!r} is registered already")
    _KINDS[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    """Removes a kind (a test's own, say); no-op for a name never registered."""
    _KINDS.pop(name, None)


def names() -> tuple[str, ...]:
    """The registered kinds, by name (whatever order their modules were imported in)."""
    return tuple(sorted(_KINDS))


def get(name: Any, role: str = "draft") -> DraftKind:
    """The kind called `name`; a one-line JobError listing the known kinds for any other."""
    kind = _KINDS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise JobError(f"{role}: unknown DraftSpec.kind {name!r}; known: {names()}")
    return kind


def help_text() -> str:
    """One line per kind: its name and description (for --help and the docs)."""
    return "\n".join(f"  {k.name:<14} {k.description}" for k in _KINDS.values())


def validate(spec: DraftSpec, role: str = "draft") -> None:
    """Raises JobError for a DraftSpec that cannot be built (before anything is loaded)."""
    get(spec.kind, role).validate(spec, role)


def describe(spec: DraftSpec) -> str:
    """A DraftSpec's kind and the options it uses, in one line."""
    return get(spec.kind).describe(spec)


def build(spec: DraftSpec, target_model: Any, target_params: Any, role: str = "draft"):
    """(drafter, params) of a DraftSpec for the fitted (vocabulary-checked) target."""
    kind = get(spec.kind, role)
    kind.validate(spec, role)
    return kind.build(spec, target_model, target_params, role)
