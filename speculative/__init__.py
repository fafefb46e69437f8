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
import importlib.abc
import importlib.util
import sys
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

# Modules that lived at the top of the package before the folders (issue 43): old name -> new
# module. `import speculative.sampling` or `from speculative import model_loading` still works and
# gives the new module itself (one object, so monkeypatching either name patches both); nothing is
# imported until the old name is asked for. The package's own code uses the new names only.
MOVED = {
    "sampling": "speculative.decoding.sampling",
    "metrics": "speculative.measure.metrics",
    "benchmark_report": "speculative.measure.report",
    "inputs": "speculative.data.inputs",
    "seqio_inputs": "speculative.data.seqio_inputs",
    "seqio_tasks": "speculative.data.seqio_tasks",
    "partitioning": "speculative.parallel.partitioning",
    "distributed": "speculative.parallel.distributed",
    "gguf_io": "speculative.checkpoints.gguf_io",
    "sharded_checkpoints": "speculative.checkpoints.sharded",
    "storage": "speculative.outputs.storage",
    "store_lock": "speculative.outputs.store_lock",
    "chunk_store": "speculative.outputs.chunk_store",
    "job_io": "speculative.outputs.job_io",
    "provenance": "speculative.outputs.provenance",
    "summaries": "speculative.outputs.summaries",
    "logs": "speculative.outputs.logs",
    "gin_flags": "speculative.config.gin_flags",
    "configurables": "speculative.config.configurables",
    "model_loading": "speculative.loading.specs",
    "pipeline": "speculative.notebook.pipeline",
    "job_config": "speculative.jobs.config",
    "job_spmd": "speculative.jobs.spmd",
    "ende_sources": "speculative.recipes.ende.sources",
    "ende_clean": "speculative.recipes.ende.clean",
}


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `speculative.<old name>` and loads it as the module it moved to."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        old = fullname.removeprefix(__name__ + ".")
        if old == fullname or old not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: Any) -> Any:
        module = importlib.import_module(MOVED[spec.name.removeprefix(__name__ + ".")])
        spec.loader_state = module.__spec__  # the import machinery sets __spec__ to `spec` next
        return module

    def exec_module(self, module: Any) -> None:
        module.__spec__ = module.__spec__.loader_state  # already run: give back its own spec


if not any(isinstance(f, _Moved) for f in sys.meta_path):
    sys.meta_path.append(_Moved())


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in MOVED:  # `speculative.sampling` without importing it first, as before the folders
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'speculative' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
