"""`SpeculationSpec`: how a speculative decode drafts and verifies (gamma or a token tree, the gamma
policy, lenience and the acceptance rule), checked once, here (docs/design.md §7).

`DecodeConfig` builds one for its speculation fields, the infer job, the benchmark's variants, the
notebook's `Pair.generate` and `speculative_decode` build theirs through the same constructor; the
jobs turn its `SpecError` into their one-line JobError (`jobs.config.speculation_spec`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from speculative.decoding import acceptance
from speculative.decoding.sampling import SamplingConfig
from speculative.decoding.tree import TreeShape


def is_int(x: Any) -> bool:
    """Whether x is an integer (a numpy one too), not a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


class SpecError(ValueError):
    """A speculation setting refused: `setting` says which check refused it (for the jobs' words):
    'gamma', 'tree' (its shape), 'lenience', 'gamma_policy', 'acceptance' (an unknown rule name),
    'tree_rule' (the rule cannot verify this tree), 'chain_rule' (it verifies trees only),
    'lenient' (the chain rule is exact only), 'adaptive' (the chain rule needs a fixed policy),
    'sampling' (the rule does not verify at that temperature)."""

    def __init__(self, setting: str, message: str):
        super().__init__(message)
        self.setting = setting


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
        if not is_int(self.initial) or self.initial < 1:
            raise ValueError(
                f"schedule initial gamma must be an integer >= 1, got {self.initial!r}"
            )

    @property
    def adaptive(self) -> bool:
        return self.kind != "fixed"


@dataclasses.dataclass(frozen=True)
class SpeculationSpec:
    """Every speculation setting of a decode, checked once (frozen and hashable).

    gamma: draft tokens per round (an integer >= 1); None with a tree (then its depth) or while
      it is still to be chosen (the infer job's GAMMA = 'auto' before planning: a chain).
    tree: a `TreeShape`, or anything `TreeShape.parse` reads (widths per depth such as (4, 2, 1),
      {'parents': (...)}); None for a chain. gamma is then its depth (another gamma is refused).
    gamma_policy: `GammaPolicy`, how many of the gamma slots each row drafts (default: all).
    lenience: l in (0, 1] of the acceptance rule; 1 is exact, l < 1 the paper's lossy rule.
    acceptance: the rule that keeps draft tokens, a name in `decoding.acceptance.RULES`; what it
      supports (chains, trees, lenience, adaptive lengths) is checked against the rest here, and
      the temperature by `check_sampling`.
    """

    gamma: int | None = None
    tree: TreeShape | None = None
    gamma_policy: GammaPolicy = GammaPolicy()
    lenience: float = 1.0
    acceptance: str = "token"

    def __post_init__(self):
        lenience = self.lenience
        if isinstance(lenience, bool) or not isinstance(lenience, (int, float, np.number)):
            raise SpecError("lenience", f"lenience must be a number in (0, 1], got {lenience!r}")
        if not 0.0 < float(lenience) <= 1.0:
            raise SpecError("lenience", f"lenience must be in (0, 1], got {lenience!r}")
        object.__setattr__(self, "lenience", float(lenience))
        if not isinstance(self.gamma_policy, GammaPolicy):
            raise SpecError(
                "gamma_policy", f"gamma_policy must be a GammaPolicy, got {self.gamma_policy!r}"
            )
        if not isinstance(self.acceptance, str) or self.acceptance not in acceptance.RULES:
            raise SpecError(
                "acceptance",
                f"acceptance must be one of {acceptance.names()}, got {self.acceptance!r}",
            )
        if self.tree is not None:
            self._set_tree()
        if self.gamma is not None:
            if not is_int(self.gamma) or self.gamma < 1:
                raise SpecError("gamma", f"gamma must be an integer >= 1, got {self.gamma!r}")
            object.__setattr__(self, "gamma", int(self.gamma))
        if self.tree is None:
            self._check_chain()
        else:
            self._check_tree()

    def _set_tree(self) -> None:
        """The tree as a TreeShape, and gamma its depth."""
        try:
            tree = TreeShape.parse(self.tree)
        except ValueError as e:
            raise SpecError("tree", str(e)) from None
        object.__setattr__(self, "tree", tree)
        if self.gamma is None:
            object.__setattr__(self, "gamma", tree.depth)
        elif self.gamma != tree.depth:
            raise SpecError(
                "gamma",
                f"gamma {self.gamma!r} differs from the depth of {tree.describe()} ({tree.depth}); "
                f"leave gamma unset with a tree",
            )

    def _check_tree(self) -> None:
        """A token tree needs a rule that verifies trees, with lenience and a gamma policy that
        rule supports there."""
        support = self.rule.trees
        if support is None:
            tree_rules = acceptance.names(True)
            needed = f"one of {tree_rules}" if len(tree_rules) > 1 else repr(tree_rules[0])
            refused = f"acceptance must be {needed}, got {self.acceptance!r}"
        elif self.lenience != 1.0 and not support.lenient:
            refused = f"lenience must be 1.0, got {self.lenience!r}"
        elif self.gamma_policy != GammaPolicy() and not support.adaptive:
            refused = f"gamma_policy must be {GammaPolicy()!r}, got {self.gamma_policy!r}"
        else:
            return
        raise SpecError(
            "tree_rule",
            f"a token tree is verified by an exact tree rule with a fixed shape: {refused}",
        )

    def _check_chain(self) -> None:
        """A chain needs a rule that verifies chains with this lenience and gamma policy."""
        name, support = self.acceptance, self.rule.chains
        if support is None:
            raise SpecError(
                "chain_rule",
                f"acceptance {name!r} verifies token trees only (give a tree); chains are "
                f"verified by {acceptance.names(False)}",
            )
        if self.lenience != 1.0 and not support.lenient:
            raise SpecError(
                "lenient",
                f"lenience {self.lenience} is defined for {acceptance.names(False, lenient=True)} "
                f"only; acceptance {name!r} is exact (lenience 1)",
            )
        if self.gamma_policy.adaptive and not support.adaptive:
            raise SpecError(
                "adaptive",
                f"acceptance {name!r} verifies full chains only (a fixed gamma policy); "
                f"adaptive policies need one of {acceptance.names(False, adaptive=True)}",
            )

    @property
    def rule(self) -> acceptance.Rule:
        """The acceptance rule (`decoding.acceptance.RULES[acceptance]`)."""
        return acceptance.rule(self.acceptance)

    @property
    def exact(self) -> bool:
        """Whether outputs follow the target's distribution (no lenience)."""
        return self.lenience == 1.0

    @property
    def block(self) -> int:
        """Tokens fed to the target per call: gamma + 1 for a chain, the tree's nodes + 1 for a
        tree, 1 while gamma is unset."""
        if self.tree is not None:
            return self.tree.size + 1
        return 1 if self.gamma is None else self.gamma + 1

    def check_sampling(self, sampling: SamplingConfig) -> None:
        """Raises ValueError unless the rule verifies (a chain or this tree) at this temperature."""
        support = self.rule.support(self.tree is not None)
        if not (support.greedy if sampling.greedy else support.sampled):
            raise SpecError(
                "sampling",
                f"acceptance {self.acceptance!r} does not verify at temperature "
                f"{sampling.temperature}",
            )
