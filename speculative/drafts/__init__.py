"""Drafts: what proposes the gamma tokens of a speculative round (docs/design.md §6).

A draft is one file implementing `base.Drafter`; `decoding.speculative_loop` calls only that
interface. `decoding.ModelDrafter` (a second, smaller LanguageModel) is the paper's draft. A draft
that a `speculative.DraftSpec` names is a kind in `registry` (its docstring: adding a kind); the
built-in kinds are imported here, after the registry, so they are registered whenever any part of
this package is imported.
"""

# ruff: noqa: I001 (the import order is the order `registry.names()` lists the built-in kinds)
from speculative.drafts import registry
from speculative.drafts import prompt_lookup
from speculative.drafts import ngram
from speculative.drafts import layer_skip

__all__ = ["layer_skip", "ngram", "prompt_lookup", "registry"]
