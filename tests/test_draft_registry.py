"""Draft kinds (`speculative.drafts.registry`): a kind registered from outside the package is a
DraftSpec kind like the built-in ones, end to end in the infer job; an unknown kind is one line
listing the known kinds."""

from __future__ import annotations

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import pytest

from speculative.decoding.drafter import DraftRequest, StatelessDrafter, one_hot_logits
from speculative.drafts import registry
from speculative.errors import JobError
from speculative.loading import specs as model_loading
from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[1]
BUILT_IN = ("bigram", "feature_head", "layer_skip", "prompt_lookup", "unigram")
_infer = helpers.tiny_infer
A = 100  # "a" in the byte vocabulary (byte 97 + 3 special ids)


@dataclasses.dataclass(frozen=True)
class FixedTokenDrafter(StatelessDrafter):
    """Proposes `token` at every position (q one-hot on it): a valid, if poor, draft."""

    vocab_size: int
    token: int

    def propose(
        self, params: tuple, state: tuple, request: DraftRequest
    ) -> tuple[jax.Array, jax.Array, tuple]:
        del params
        rows = request.context.last.shape[0]
        tokens = jnp.full((rows, request.gamma), self.token, jnp.int32)
        return tokens, one_hot_logits(tokens, self.vocab_size), state


def _build(spec, target_model, target_params, role):
    del spec, target_params, role
    return FixedTokenDrafter(target_model.vocab_size, A), ()


FIXED = registry.DraftKind(
    name="fixed_token",
    description="always proposes the token 'a' (a test's own kind)",
    build=_build,
    describe=lambda spec: "fixed_token (always 'a')",
)


@pytest.fixture
def fixed_kind():
    registry.register(FIXED)
    yield FIXED
    registry.unregister(FIXED.name)


@pytest.fixture(autouse=True)
def _cwd_repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def _draft_spec(kind: str) -> list[str]:
    # configs/drafts/prompt_lookup.gin binds the DraftSpec into the job; the kind is replaced.
    return [
        "--gin_file=configs/drafts/prompt_lookup.gin",
        f"--gin.speculative.DraftSpec.kind='{kind}'",
    ]


def test_built_in_kinds_are_registered_by_their_files():
    assert registry.names() == BUILT_IN
    assert all(registry.get(name).description for name in BUILT_IN)
    assert all(f"  {name} " in registry.help_text() for name in BUILT_IN)
    assert model_loading.DraftSpec is registry.DraftSpec


def test_register_refuses_a_second_kind_of_the_same_name(fixed_kind):
    registry.register(fixed_kind)  # the same kind again: a no-op
    assert registry.names() == tuple(sorted((*BUILT_IN, "fixed_token")))
    with pytest.raises(ValueError, match="'fixed_token' is registered already"):
        registry.register(dataclasses.replace(fixed_kind, description="another"))


def test_a_kind_registered_outside_the_package_runs_in_the_infer_job(tmp_path, fixed_kind):
    spec = registry.DraftSpec(kind="fixed_token")
    model_loading.validate_model_spec(spec, "draft")
    assert model_loading.describe(spec) == "fixed_token (always 'a')"
    plain, _ = _infer(tmp_path, "plain", "--gin.SPECULATIVE=False")
    rows, summary = _infer(tmp_path, "fixed", *_draft_spec("fixed_token"))
    assert [r["output_ids"] for r in rows] == [r["output_ids"] for r in plain]
    assert all(r["exact"] is True for r in rows)
    assert "fixed_token (always 'a')" in summary["draft"]


def test_an_unknown_kind_is_one_line_listing_the_known_kinds(tmp_path):
    with pytest.raises(JobError, match="^draft: unknown DraftSpec.kind 'nope'; known: ") as e:
        _infer(tmp_path, "nope", *_draft_spec("nope"))
    assert "\n" not in str(e.value)
    assert all(repr(name) in str(e.value) for name in BUILT_IN)
    with pytest.raises(JobError, match="^target: unknown DraftSpec.kind 3; known: "):
        registry.validate(registry.DraftSpec(kind=3), "target")
