"""The static settings of one decode: `DecodeConfig` (`GammaPolicy` is re-exported from spec.py).

`DecodeConfig` checks its own settings, and its speculation settings by building the
`SpeculationSpec` that holds them (spec.py, the one place they are checked; docs/design.md §7).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from speculative.data import inputs
from speculative.decoding.sampling import SamplingConfig
from speculative.decoding.spec import GammaPolicy, SpeculationSpec, is_int
from speculative.decoding.tree import TreeShape
from speculative.models.base import LanguageModel

__all__ = ["DecodeConfig", "GammaPolicy"]


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """Everything static about one decode; hashable, so it is a static `jax.jit` argument.

    max_decode_len: tokens generated at most per row (>= 1).
    stop_ids: a row stops after emitting any of these (an int is accepted and becomes a 1-tuple).
    sampling: temperature / top-k / top-p, shared by the draft and the target.
    gamma: draft tokens proposed per speculative round (>= 1); None for plain decoding.
    lenience: l in (0, 1], the acceptance rule's factor (`sampling.verify_detailed`). 1 (the
      default) is exact; l < 1 is the paper's lossy lenient acceptance, and every output made with
      it says so (`DecodeOutput.exact` is False).
    gamma_policy: `GammaPolicy`, how many of the gamma slots each row drafts (default: all).
    acceptance: the rule that keeps draft tokens, a name in `decoding.acceptance.RULES`: 'token'
      (the paper's, the default), 'block' (block verification, chains) or 'traversal' (traversal
      verification, trees); the last two are exact, so lenience 1.
      What each rule supports (chains, trees, lenience, adaptive lengths) is checked by the
      `SpeculationSpec` these settings make (`spec`; `from_spec` makes a DecodeConfig of one).
    tree: a `decoding.tree.TreeShape` to propose a token tree each round instead of a chain
      (verified by a rule that supports trees, 'token' by default: exact, so lenience 1 and a
      fixed gamma policy). gamma is then the tree's depth (set from it when left None).
    count_ranks: with a tree, count which sibling rank the accepted path took at each depth
      (`DecodeStats.accepted_rank`, the tree planner's positional acceptance); off by default,
      and then nothing of it is in the compiled program.
    """

    max_decode_len: int
    stop_ids: tuple[int, ...]
    sampling: SamplingConfig = SamplingConfig()
    gamma: int | None = None
    lenience: float = 1.0
    gamma_policy: GammaPolicy = GammaPolicy()
    acceptance: str = "token"
    tree: TreeShape | None = None
    count_ranks: bool = False

    def __post_init__(self):
        ids = self.stop_ids
        ids = (ids,) if isinstance(ids, (int, np.integer)) else tuple(ids)
        if not ids or not all(isinstance(i, (int, np.integer)) for i in ids):
            raise ValueError(
                f"eos_id must be an int or a non-empty sequence of ints, got {self.stop_ids!r}"
            )
        object.__setattr__(self, "stop_ids", tuple(int(i) for i in ids))
        if not isinstance(self.sampling, SamplingConfig):
            raise ValueError(
                f"sampling must be a SamplingConfig, got {type(self.sampling).__name__}"
            )
        if not is_int(self.max_decode_len) or self.max_decode_len < 1:
            raise ValueError(f"max_decode_len must be an integer >= 1, got {self.max_decode_len!r}")
        object.__setattr__(self, "max_decode_len", int(self.max_decode_len))
        spec = SpeculationSpec(
            self.gamma, self.tree, self.gamma_policy, self.lenience, self.acceptance
        )  # every speculation setting is checked there
        for name in ("gamma", "tree", "lenience"):  # as the spec reads them: ints, a TreeShape
            object.__setattr__(self, name, getattr(spec, name))
        spec.check_sampling(self.sampling)
        object.__setattr__(self, "_spec", spec)
        if self.count_ranks is not False and (self.count_ranks is not True or self.tree is None):
            raise ValueError(
                f"count_ranks counts a tree's sibling ranks: False, or True with a tree; got "
                f"{self.count_ranks!r} with tree {self.tree!r}"
            )

    @classmethod
    def from_spec(
        cls,
        spec: SpeculationSpec,
        max_decode_len: int,
        stop_ids: int | tuple[int, ...],
        sampling: SamplingConfig = SamplingConfig(),
        count_ranks: bool = False,
    ) -> DecodeConfig:
        """The DecodeConfig of a speculative decode with `spec`'s settings."""
        return cls(
            max_decode_len, stop_ids, sampling, spec.gamma, spec.lenience, spec.gamma_policy,
            spec.acceptance, spec.tree, count_ranks,
        )  # fmt: skip

    @property
    def spec(self) -> SpeculationSpec | None:
        """The speculation settings (checked once, when this was made); None for plain decoding
        (gamma unset)."""
        return None if self.gamma is None else self._spec

    @property
    def exact(self) -> bool:
        """Whether outputs follow the target's distribution (no lenience)."""
        return self._spec.exact

    @property
    def block(self) -> int:
        """Tokens fed to the target per call: gamma + 1 for a chain, the tree's nodes + 1 for a
        tree, 1 plain."""
        return self._spec.block

    def cache_length(self, model: LanguageModel, batch: dict[str, jax.Array]) -> int:
        """The static cache length `model` needs for this decode of `batch`."""
        return model.cache_length(
            inputs.input_tokens(batch).shape[1], self.max_decode_len, self.block
        )
