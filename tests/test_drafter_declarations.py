"""What a draft can do is declared on its class (`Drafter.grows_trees`, `reads_target_features`,
`reported_stats`), and the declarations agree with the methods, both ways: a misspelt
`propose_tree` fails here instead of leaving a draft silently chain-only."""

from __future__ import annotations

import dataclasses

import pytest

import speculative.drafts  # noqa: F401  (registers and imports every built-in draft)
from speculative import decoding
from speculative.decoding.drafter import (
    OPTIONAL_STATS,
    DraftRequest,
    StatelessDrafter,
    declaration_errors,
)
from speculative.drafts.cross_vocab import CrossVocabDrafter
from speculative.drafts.feature_head import FeatureHeadDrafter
from speculative.drafts.layer_skip import LayerSkipDrafter
from speculative.drafts.ngram import NgramDrafter
from speculative.drafts.prompt_lookup import PromptLookupDrafter
from speculative.drafts.staged import StagedDrafter
from tests.test_draft_registry import FixedTokenDrafter


def _subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


DRAFTERS = sorted(set(_subclasses(StatelessDrafter)), key=lambda c: c.__qualname__)
# Each class defined below breaks its declarations on purpose; they are left out of DRAFTERS.
DRAFTERS = [c for c in DRAFTERS if c.__module__ != __name__]


def test_every_drafter_class_is_found():
    names = {c.__name__ for c in DRAFTERS}
    assert {"ModelDrafter", "NgramDrafter", "PromptLookupDrafter", "CrossVocabDrafter"} <= names
    assert {"FeatureHeadDrafter", "LayerSkipDrafter", "StagedDrafter"} <= names


@pytest.mark.parametrize("cls", DRAFTERS, ids=lambda c: c.__qualname__)
def test_declarations_match_methods(cls):
    assert declaration_errors(cls) == []


def test_declared_capabilities():
    trees = {c for c in DRAFTERS if c.grows_trees}
    assert {decoding.ModelDrafter, NgramDrafter, PromptLookupDrafter, CrossVocabDrafter} <= trees
    assert {FeatureHeadDrafter, LayerSkipDrafter, StagedDrafter} <= trees
    assert not FixedTokenDrafter.grows_trees and not StatelessDrafter.grows_trees
    assert [c for c in DRAFTERS if c.reads_target_features] == [FeatureHeadDrafter]
    assert CrossVocabDrafter.reported_stats == ("outside_mass", "draft_stalls")
    assert StagedDrafter.reported_stats == ("model_calls", "lookup_accepted")
    reporting = {CrossVocabDrafter, StagedDrafter}
    assert set(OPTIONAL_STATS) == {s for c in reporting for s in c.reported_stats}
    assert all(c.reported_stats == () for c in DRAFTERS if c not in reporting)


@dataclasses.dataclass(frozen=True)
class _Misspelt(FixedTokenDrafter):
    grows_trees = True

    def propose_trees(self, *args):  # not `propose_tree`: the declaration is unmet
        raise AssertionError(args)


@dataclasses.dataclass(frozen=True)
class _Undeclared(FixedTokenDrafter):
    def propose_tree(self, *args):  # grows trees, but says it does not
        raise AssertionError(args)

    def outside_mass(self, state):  # reports a stat it does not declare
        return state


@dataclasses.dataclass(frozen=True)
class _Declined(decoding.ModelDrafter):
    """Declines the propose_tree it inherits: allowed."""

    grows_trees = False


def test_mismatches_are_errors():
    assert declaration_errors(_Misspelt) == [
        "_Misspelt declares grows_trees but does not implement propose_tree"
    ]
    errors = declaration_errors(_Undeclared)
    assert "_Undeclared implements propose_tree but does not declare grows_trees" in errors
    assert any("'outside_mass'" in e for e in errors) and len(errors) == 2
    assert declaration_errors(_Declined) == []


def test_undeclared_tree_is_refused():
    """A draft that does not declare trees is refused a tree, before anything is compiled."""
    tree = decoding.TreeShape.parse((2, 1))
    with pytest.raises(ValueError, match="draft FixedTokenDrafter cannot propose a tree"):
        decoding.resolve_drafter(_target(), FixedTokenDrafter(8, 1), _config(tree))
    with pytest.raises(NotImplementedError, match="cannot propose a tree"):
        _Misspelt(8, 1).propose_tree(None, None, DraftRequest(None, None, None, tree.depth, tree))


def test_a_tree_request_states_one_depth():
    """gamma and the tree's depth say one thing; a request where they differ is refused."""
    tree = decoding.TreeShape.parse((2, 1))
    with pytest.raises(ValueError, match="gamma 3 is not the tree's depth 2"):
        DraftRequest(None, None, None, 3, tree)


def _target():
    @dataclasses.dataclass(frozen=True)
    class Target:
        vocab_size: int = 8

    return Target()


def _config(tree):
    return decoding.DecodeConfig(4, 0, tree=tree, gamma=tree.depth)
