"""speculative: exact batched speculative decoding for JAX/Flax models, in the style of T5X.

The names a notebook needs, imported on first use (so `import speculative` stays cheap and
`python -m speculative.fetch` does not pull in JAX):

    import speculative
    pair = speculative.load_pair("qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b")
    out = pair.generate(["def fibonacci(n):"], max_new_tokens=64, gamma=5)

    speculative.speculative_decode(target, target_params, draft, draft_params, batch, gamma=4,
                                   max_decode_len=64, eos_id=1)

The layout of the package is drawn in docs/design.md §7.
"""

from __future__ import annotations

import importlib
from typing import Any

from speculative.version import __version__

# name -> module that defines it.
_LAZY = {
    # Decoding (speculative.decoding is the public API of the algorithm).
    "speculative_decode": "speculative.decoding",
    "autoregressive_decode": "speculative.decoding",
    "DecodeOutput": "speculative.decoding",
    "DecodeStats": "speculative.decoding",
    "GammaPolicy": "speculative.decoding",
    "TreeShape": "speculative.decoding",
    "Drafter": "speculative.decoding",
    "SamplingConfig": "speculative.decoding.sampling",
    # Loading, as the gin jobs load.
    "ModelSpec": "speculative.loading.specs",
    "VocabSpec": "speculative.loading.specs",
    "DraftSpec": "speculative.loading.specs",
    "load_model": "speculative.loading.specs",
    "load_vocabulary": "speculative.loading.specs",
    "JobError": "speculative.errors",
    # Text in, text out.
    "load_pair": "speculative.notebook.pipeline",
    "Pair": "speculative.notebook.pipeline",
    "Generation": "speculative.notebook.pipeline",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'speculative' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
