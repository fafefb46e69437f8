"""The static settings of one decode: `GammaPolicy` and `DecodeConfig`.

`DecodeConfig` is the one place decode settings are checked; jobs build one and read it
(docs/design.md §7).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from speculative.data import inputs
from speculative.decoding import acceptance
from speculative.decoding.sampling import SamplingConfig
from speculative.decoding.tree import TreeShape
from speculative.models.base import LanguageModel


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


@dataclasses.dataclass(frozen=True)
class GammaPolicy:
    """How many of the gamma draft slots each row uses per round (DecodeConfig.gamma is the most).

    kind:
      "fixed": every row drafts gamma tokens every round (the paper's algorithm).
      "confidence": a row stops drafting after a token whose draft confidence max_x q(x) is below
        `threshold` (Hugging Face's assistant confidence stop; `decoding.drafter.draft_confidence`).
      "schedule": each row's length starts at `initial` and moves by +2 after a round that accepted
        every drafted token, by -1 otherwise, within 1..gamma (Hugging Face's heuristic schedule,
        per row here).
    Shapes stay static: the target always scores gamma + 1 positions and the unused slots are never
    accepted. Exact: a row's length depends only on its draft and on earlier rounds.
    """

    kind: str = "fixed"
    threshold: float = 0.4
    initial: int = 4

    def __post_init__(self):
        if self.kind not in ("fixed", "confidence", "schedule"):
            raise ValueError(
                f"gamma policy must be 'fixed', 'confidence' or 'schedule', got {self.kind!r}"
            )
        if not 0.0 <= self.threshold < 1.0:
            raise ValueError(f"confidence threshold must be in [0, 1), got {self.threshold!r}")
        if not _is_int(self.initial) or self.initial < 1:
            raise ValueError(
                f"schedule initial gamma must be an integer >= 1, got {self.initial!r}"
            )

    @property
    def adaptive(self) -> bool:
        return self.kind != "fixed"


def check_tree_settings(acceptance_name: Any, lenience: Any, gamma_policy: Any) -> None:
    """Raises ValueError naming the first setting a token tree cannot run with: a rule that
    verifies trees (`acceptance.RULES`), and lenience and a gamma policy that rule supports there.

    The one rule: DecodeConfig checks its tree with it, and the jobs' TREE check
    (`job_config.check_tree`) turns its error into theirs before anything is loaded.
    """
    tree_rules = acceptance.names(True)
    rule = acceptance.RULES.get(acceptance_name) if isinstance(acceptance_name, str) else None
    support = rule.trees if rule is not None else None
    if support is None:
        needed = f"one of {tree_rules}" if len(tree_rules) > 1 else repr(tree_rules[0])
        refused = f"acceptance must be {needed}, got {acceptance_name!r}"
    elif lenience != 1.0 and not support.lenient:
        refused = f"lenience must be 1.0, got {lenience!r}"
    elif gamma_policy != GammaPolicy() and not support.adaptive:
        refused = f"gamma_policy must be {GammaPolicy()!r}, got {gamma_policy!r}"
    else:
        return
    raise ValueError(
        f"a token tree is verified by an exact tree rule with a fixed shape: {refused}"
    )


def check_chain_settings(acceptance_name: Any, lenience: float, gamma_policy: GammaPolicy) -> None:
    """Raises ValueError unless `acceptance_name` is a rule that verifies chains with this lenience
    and gamma policy (`acceptance.RULES`)."""
    if acceptance_name not in acceptance.RULES:
        raise ValueError(f"acceptance must be one of {acceptance.names()}, got {acceptance_name!r}")
    support = acceptance.RULES[acceptance_name].chains
    if support is None:
        raise ValueError(
            f"acceptance {acceptance_name!r} verifies token trees only (give a tree); chains are "
            f"verified by {acceptance.names(False)}"
        )
    if lenience != 1.0 and not support.lenient:
        raise ValueError(
            f"lenience {lenience} is defined for {acceptance.names(False, lenient=True)} only; "
            f"acceptance {acceptance_name!r} is exact (lenience 1)"
        )
    if gamma_policy.adaptive and not support.adaptive:
        raise ValueError(
            f"acceptance {acceptance_name!r} verifies full chains only (a fixed gamma policy); "
            f"adaptive policies need one of {acceptance.names(False, adaptive=True)}"
        )


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
      What each rule supports (chains, trees, lenience, adaptive lengths) is checked here.
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
        if not _is_int(self.max_decode_len) or self.max_decode_len < 1:
            raise ValueError(f"max_decode_len must be an integer >= 1, got {self.max_decode_len!r}")
        object.__setattr__(self, "max_decode_len", int(self.max_decode_len))
        if self.tree is not None:
            self._check_tree()
        if self.count_ranks is not False and (self.count_ranks is not True or self.tree is None):
            raise ValueError(
                f"count_ranks counts a tree's sibling ranks: False, or True with a tree; got "
                f"{self.count_ranks!r} with tree {self.tree!r}"
            )
        if self.gamma is not None:
            if not _is_int(self.gamma) or self.gamma < 1:
                raise ValueError(f"gamma must be an integer >= 1, got {self.gamma!r}")
            object.__setattr__(self, "gamma", int(self.gamma))
        if isinstance(self.lenience, bool) or not 0.0 < float(self.lenience) <= 1.0:
            raise ValueError(f"lenience must be in (0, 1], got {self.lenience!r}")
        object.__setattr__(self, "lenience", float(self.lenience))
        if not isinstance(self.gamma_policy, GammaPolicy):
            raise ValueError(f"gamma_policy must be a GammaPolicy, got {self.gamma_policy!r}")
        if self.tree is None:  # a tree's settings were checked by _check_tree
            check_chain_settings(self.acceptance, self.lenience, self.gamma_policy)
        support = acceptance.rule(self.acceptance).support(self.tree is not None)
        if not (support.greedy if self.sampling.greedy else support.sampled):
            raise ValueError(
                f"acceptance {self.acceptance!r} does not verify at temperature "
                f"{self.sampling.temperature}"
            )

    def _check_tree(self) -> None:
        tree = TreeShape.parse(self.tree)
        object.__setattr__(self, "tree", tree)
        if self.gamma is None:
            object.__setattr__(self, "gamma", tree.depth)
        elif self.gamma != tree.depth:
            raise ValueError(
                f"gamma {self.gamma!r} differs from the depth of {tree.describe()} ({tree.depth}); "
                f"leave gamma unset with a tree"
            )
        check_tree_settings(self.acceptance, self.lenience, self.gamma_policy)

    @property
    def exact(self) -> bool:
        """Whether outputs follow the target's distribution (no lenience)."""
        return self.lenience == 1.0

    @property
    def block(self) -> int:
        """Tokens fed to the target per call: gamma + 1 for a chain, the tree's nodes + 1 for a
        tree, 1 plain."""
        if self.tree is not None:
            return self.tree.size + 1
        return 1 if self.gamma is None else self.gamma + 1

    def cache_length(self, model: LanguageModel, batch: dict[str, jax.Array]) -> int:
        """The static cache length `model` needs for this decode of `batch`."""
        return model.cache_length(
            inputs.input_tokens(batch).shape[1], self.max_decode_len, self.block
        )
