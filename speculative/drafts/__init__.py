"""Drafts: what proposes the gamma tokens of a speculative round (docs/design.md §6).

A draft is one file implementing `decoding.Drafter`; `decoding.speculative_loop` calls only that
interface. `decoding.ModelDrafter` (a second, smaller LanguageModel) is the paper's draft. A draft
that a `speculative.DraftSpec` names is a kind in `registry` (its docstring: adding a kind). Every
module of this package is imported here, after the registry, so a kind's file registers it the
moment any part of the package is imported: adding a file is all it takes.
"""

import importlib
import pkgutil

from speculative.drafts import registry

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")

__all__ = ["registry"]
