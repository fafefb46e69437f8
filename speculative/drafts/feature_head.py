"""A draft that reads the target's hidden states: a trained feature-level head (EAGLE-style,
`models.feature_head`), as a chain or a token tree.

The loop hands the drafter the target's final hidden states of every token it kept
(`observe_target`, docs/design.md §1): after the prefill, the prompt's; after each verify call,
those along the accepted path, each paired with the token that followed it. The head appends
those entries to its own KV cache (overwriting the entries it drafted from its own guesses) and
keeps its prediction of the next hidden state; `propose` turns that into q for the first draft
token and steps on its own predictions for the rest. One head call of gamma + 1 entries per round
catches up, then one single-entry call per further draft token: a step is one transformer layer
and the output head (a shortlist of the target's), a few percent of a target step.

Checkpoints are written by `python -m speculative.train_head`: a directory with `head.json` (the
head's shape) and T5X checkpoints `checkpoint_<step>` holding `head` (the head's parameters) and
`lm_head_ids` (the ids its output head scores, sorted). The token embedding and the output head's
rows are the target's own, read from the target's parameters at build time.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
from typing import Any, ClassVar

import flax
import jax
import jax.numpy as jnp
import numpy as np

from speculative.checkpoints import families, t5x, validation
from speculative.checkpoints.t5x_write import checkpoint_steps
from speculative.decoding.drafter import DraftRequest, StatelessDrafter
from speculative.decoding.sampling import sample
from speculative.decoding.tree import grow_first_child_tree
from speculative.drafts import registry
from speculative.errors import JobError
from speculative.models import padding
from speculative.models.base import DecodeState
from speculative.models.feature_head import (
    FeatureHead,
    FeatureHeadConfig,
    output_logits,
    target_lm_head,
)

log = logging.getLogger(__name__)

HEAD_CONFIG_FILE = "head.json"


@flax.struct.dataclass
class HeadDraftState:
    """cache: the head's DecodeState (index = the position of the row's newest committed token);
    feature: [B, E] the head's prediction of the target's hidden state there, whose output head
    gives q for the first draft token."""

    cache: DecodeState
    feature: jax.Array


@dataclasses.dataclass(frozen=True)
class FeatureHeadDrafter(StatelessDrafter):
    """A trained `FeatureHead` as a Drafter. params: {"head", "embedding" [V', E] (the target's
    token table), "lm_head" ({"kernel", "token_ids"}: the rows of the ids it scores)}.

    vocab_size: the target's (fitted) vocabulary width; used: ids from here on are padding
    (-inf, as the fitted target gives them).
    """

    head: FeatureHead
    vocab_size: int
    used: int
    grows_trees: ClassVar[bool] = True
    reads_target_features: ClassVar[bool] = True

    @property
    def feature_width(self) -> int:
        """E of the target's hidden states it reads."""
        return self.head.config.emb_dim

    def check_target(self, target: Any) -> None:
        super().check_target(target)
        bare, _ = padding.split(target)
        if not families.supports(bare, "feature_head"):
            raise ValueError(f"a feature head drafts for a decoder-only DecoderLM, got {target!r}")
        if bare.config.emb_dim != self.head.config.emb_dim:
            raise ValueError(
                f"the feature head reads {self.head.config.emb_dim}-wide hidden states; the "
                f"target's are {bare.config.emb_dim}"
            )

    def validate(self, batch: dict[str, jax.Array], config: Any) -> None:
        super().validate(batch, config)
        if "prompt" not in batch:
            raise ValueError("a feature head drafts for decoder-only batches (batch['prompt'])")

    def init(self, params: Any, batch: dict[str, jax.Array], config: Any) -> HeadDraftState:
        rows = batch["prompt"].shape[0]
        length = batch["prompt"].shape[1] + config.max_decode_len + config.block
        feature = jnp.zeros((rows, self.head.config.emb_dim), jnp.float32)
        return HeadDraftState(self.head.init_cache(rows, length), feature)

    def observe_target(
        self,
        params: Any,
        state: HeadDraftState,
        features: jax.Array,
        next_tokens: jax.Array,
        start: jax.Array,
        count: jax.Array,
    ) -> HeadDraftState:
        """Appends the target's kept hidden states: features [B, K, E] of the tokens at positions
        start .. start + K - 1, next_tokens [B, K] the token after each; the first count [B] are
        real (the rest are overwritten later). Returns the state at index start + count."""
        embeddings = params["embedding"][next_tokens]
        predicted, cache = self.head.extend(
            params["head"], state.cache.replace(index=start), features, embeddings
        )
        newest = jnp.maximum(count - 1, 0)[:, None, None]
        feature = jnp.take_along_axis(predicted, newest, axis=1)[:, 0]
        return HeadDraftState(cache.replace(index=start + count), feature)

    def draft_logits(self, params: Any, feature: jax.Array) -> jax.Array:
        return output_logits(feature, params["lm_head"], self.vocab_size, self.used)

    def draft_step(self, params: Any, carry: tuple, token: jax.Array) -> tuple[jax.Array, tuple]:
        """One draft step: (cache, predicted feature [B, E]) and the token drafted from it ->
        (logits [B, V] of the token after, new carry)."""
        cache, feature = carry
        embedding = params["embedding"][token][:, None]
        predicted, cache = self.head.extend(params["head"], cache, feature[:, None], embedding)
        return self.draft_logits(params, predicted[:, 0]), (cache, predicted[:, 0])

    def propose(
        self, params: Any, state: HeadDraftState, request: DraftRequest
    ) -> tuple[jax.Array, jax.Array, HeadDraftState]:
        """gamma tokens: the first from the kept prediction, then gamma - 1 head steps: (tokens
        [B, G], logits [B, G, V], state). The context is not read: observe_target has put the
        cache at the newest committed token."""
        sampling = request.sampling
        logits = self.draft_logits(params, state.feature)
        rngs = jax.random.split(request.rng, request.gamma)
        token, _ = sample(rngs[0], logits, sampling)

        def step(carry, step_rng):
            head_carry, token = carry
            step_logits, head_carry = self.draft_step(params, head_carry, token)
            next_token, _ = sample(step_rng, step_logits, sampling)
            return (head_carry, next_token), (next_token, step_logits)

        carry = ((state.cache, state.feature), token)
        _, (tokens, rest) = jax.lax.scan(step, carry, rngs[1:])
        tokens = jnp.concatenate([token[:, None], tokens.T], axis=1)
        all_logits = jnp.concatenate([logits[:, None], jnp.swapaxes(rest, 0, 1)], axis=1)
        return tokens, all_logits, state  # the drafted entries are overwritten by observe_target

    def propose_tree(
        self, params: Any, state: HeadDraftState, request: DraftRequest
    ) -> tuple[jax.Array, jax.Array, HeadDraftState]:
        """A tree of first children (decoding/tree.py) grown by D - 1 head steps: (tokens
        [B, N], log_q [B, N, V], state)."""
        root_logits = self.draft_logits(params, state.feature)
        tokens, log_q, _ = grow_first_child_tree(
            lambda carry, token: self.draft_step(params, carry, token),
            (state.cache, state.feature),
            root_logits,
            request.tree,
            request.rng,
            request.sampling,
        )
        return tokens, log_q, state


# ------------------------------------------------------------------------------------------------
# Checkpoints and the 'feature_head' draft kind (DraftSpec.checkpoint).


def save_head_config(directory: str | pathlib.Path, config: FeatureHeadConfig) -> None:
    path = pathlib.Path(directory) / HEAD_CONFIG_FILE
    path.write_text(json.dumps(dataclasses.asdict(config), indent=1), encoding="utf-8")


def read_head_config(directory: str | pathlib.Path) -> FeatureHeadConfig:
    """The head's shape from `directory/head.json`; ValueError naming the file otherwise."""
    path = pathlib.Path(directory) / HEAD_CONFIG_FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return FeatureHeadConfig(**raw)
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"{path}: not a feature head's config ({e})") from e


def load_head(
    directory: str | pathlib.Path, step: int | None = None
) -> tuple[FeatureHeadConfig, Any, np.ndarray, int]:
    """(config, head params, lm_head ids [S], step) of a head checkpoint directory (the newest
    complete checkpoint, or `step`); every parameter's name and shape is checked. `~` expands."""
    directory = os.path.expanduser(str(directory))
    config = read_head_config(directory)
    steps = checkpoint_steps(directory)
    if not steps:
        raise ValueError(f"{directory}: no complete checkpoint_<step> of a feature head")
    step = steps[-1] if step is None else step
    path = str(pathlib.Path(directory) / f"checkpoint_{step}")
    head_shapes = FeatureHead(config).param_shapes()
    flat = t5x.read_t5x_params(path, None, False)
    ids = np.asarray(flat.pop("lm_head_ids", np.zeros((0,), np.int32)))
    if ids.ndim != 1 or ids.size == 0 or np.any(np.diff(ids) <= 0) or ids[0] < 0:
        raise ValueError(f"{path}: lm_head_ids must be sorted distinct ids, got shape {ids.shape}")
    heads = {k.removeprefix("head/"): v for k, v in flat.items() if k.startswith("head/")}
    extra = sorted(k for k in flat if not k.startswith("head/"))
    if extra:
        raise ValueError(f"{path}: unexpected parameters {extra[:3]}")
    params = validation.to_params(heads, head_shapes, jnp.float32, f"feature head {path}")
    return config, params, ids.astype(np.int32), step


def build_drafter(
    target_model: Any, target_params: Any, config: FeatureHeadConfig, head_params: Any, ids: Any
) -> tuple[FeatureHeadDrafter, dict[str, Any]]:
    """(drafter, params) for a fitted DecoderLM target: the head, the target's embedding table
    and the rows of its output head for `ids` (the whole head when ids is None)."""
    bare, _ = padding.split(target_model)
    if not families.supports(bare, "feature_head"):
        raise ValueError(f"a feature head drafts for a DecoderLM target, got {target_model!r}")
    lm_head = target_lm_head(bare.config, target_params)
    if ids is not None:
        ids = np.asarray(ids, np.int32)
        if ids[-1] >= lm_head["kernel"].shape[0] or "token_ids" in lm_head:
            raise ValueError(f"head ids reach {ids[-1]}; the target's output head has other rows")
        lm_head = {"kernel": jnp.asarray(lm_head["kernel"])[ids], "token_ids": jnp.asarray(ids)}
    used = getattr(target_model, "used", bare.vocab_size)
    drafter = FeatureHeadDrafter(FeatureHead(config), target_model.vocab_size, used)
    params = {
        "head": head_params,
        "embedding": target_params["token_embedder"]["embedding"],
        "lm_head": lm_head,
    }
    drafter.check_target(target_model)
    return drafter, params


def _validate(spec: registry.DraftSpec, role: str) -> None:
    if not spec.checkpoint:
        raise JobError(
            f"{role}: a feature_head draft needs DraftSpec.checkpoint (a head directory)"
        )


def _describe(spec: registry.DraftSpec) -> str:
    return f"feature_head ({spec.checkpoint})"


def _build(spec: registry.DraftSpec, target_model: Any, target_params: Any, role: str):
    try:
        config, head_params, ids, step = load_head(spec.checkpoint)
        log.info(f"{role}: feature head {spec.checkpoint} (step {step}, {len(ids)} ids)")
        return build_drafter(target_model, target_params, config, head_params, ids)
    except (OSError, ValueError) as e:
        raise JobError(str(e), role=role, path=spec.checkpoint) from e


DESCRIPTION = "a trained head reading the target's hidden states (EAGLE-style; checkpoint)"
registry.register(registry.DraftKind("feature_head", DESCRIPTION, _build, _validate, _describe))
