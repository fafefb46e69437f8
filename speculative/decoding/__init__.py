"""Plain and speculative decoding.

The package, read in order (docs/design.md §7):
  tree.py           `TreeShape`: static token-tree shapes, and how a sampled draft grows one
  acceptance/       the acceptance rules, plug-ins: `Rule`, `RULES` (token, block, traversal),
                    and `verify`, the loop's one call for chains and trees
  spec.py           `GammaPolicy`, `SpeculationSpec`: the speculation settings (gamma or a tree,
                    gamma policy, lenience, acceptance rule), checked once, here
  config.py         `DecodeConfig`: every static setting of one decode (its speculation: a spec)
  state.py          `DecodeStats`, `DecodeOutput`, `LoopState`, `prefill`,
                    `teacher_forced_logits` (the target's view of given outputs)
  drafter.py        the `Drafter` protocol, `DraftContext` and `DraftRequest`: the interface every
                    draft implements
  model_drafter.py  `ModelDrafter` (the paper's draft: a smaller model), `as_drafter`
  loop.py           the whole decode loop: `autoregressive_loop`, `speculative_loop`
  checks.py         host-side validation and the NaN check
  api.py            the public calls `autoregressive_decode`, `speculative_decode`, `decode` (by a
                    DecodeConfig already made), and their
                    pieces (`resolve_drafter`, `validate_inputs`, `prepare`) the benchmark reuses

`from speculative import decoding; decoding.speculative_decode(...)` is the entry point; every name
below is part of the public API.
"""

from speculative.decoding.api import (
    LoopCall,
    autoregressive_decode,
    decode,
    place_inputs,
    prepare,
    resolve_drafter,
    speculative_decode,
    validate_inputs,
)
from speculative.decoding.checks import NaNLogitsError, check_finite, check_pair, validate_batch
from speculative.decoding.config import DecodeConfig, GammaPolicy
from speculative.decoding.drafter import DraftContext, Drafter, DraftRequest, StatelessDrafter
from speculative.decoding.loop import autoregressive_loop, speculative_loop
from speculative.decoding.model_drafter import ModelDrafter, as_drafter
from speculative.decoding.spec import SpeculationSpec
from speculative.decoding.state import (
    DecodeOutput,
    DecodeStats,
    LoopState,
    prefill,
    teacher_forced_logits,
)
from speculative.decoding.tree import TreeShape

__all__ = [
    "DecodeConfig",
    "DecodeOutput",
    "DecodeStats",
    "DraftContext",
    "DraftRequest",
    "Drafter",
    "GammaPolicy",
    "LoopCall",
    "LoopState",
    "ModelDrafter",
    "NaNLogitsError",
    "SpeculationSpec",
    "StatelessDrafter",
    "TreeShape",
    "as_drafter",
    "autoregressive_decode",
    "autoregressive_loop",
    "check_finite",
    "check_pair",
    "decode",
    "place_inputs",
    "prefill",
    "prepare",
    "resolve_drafter",
    "speculative_decode",
    "speculative_loop",
    "teacher_forced_logits",
    "validate_batch",
    "validate_inputs",
]
