"""The compiled decode loops must not move weights around on every step.

On XLA:CPU a tied-embedding logits layer written as `x @ table.T` compiled to a copy of the whole
transposed [E, V] table inside the draft's nested loop: one table-sized copy per draft step, which
cost the real 0.5B draft ~100 ms a step. These tests read the optimised HLO of the real programs
and fail on any copy or transpose whose result has the shape of a weight matrix.
"""

from __future__ import annotations

import re

import jax
import pytest

from speculative import decoding
from speculative.data import inputs
from speculative.decoding.sampling import SamplingConfig
from tests import helpers

# Distinct sizes, so that no activation shape can be mistaken for a weight's.
VOCAB, EMB, MLP = 4099, 56, 113


def _decoder(emb: int, layers: int, tied: bool):
    return helpers.abstract_decoder(VOCAB, emb, layers, MLP, tied)


def _t5(emb: int, layers: int):
    return helpers.abstract_t5(VOCAB, emb, layers, MLP)


def _weight_shapes(*param_trees) -> set[tuple[int, ...]]:
    """Every matrix-like weight shape (ignoring size-1 axes), in any axis order."""
    shapes = set()
    for tree in param_trees:
        for leaf in jax.tree_util.tree_leaves(tree):
            dims = tuple(sorted(d for d in leaf.shape if d > 1))
            if len(dims) >= 2 and min(dims) >= 8:
                shapes.add(dims)
    return shapes


def _weight_moves(hlo: str, weight_shapes: set[tuple[int, ...]]) -> list[str]:
    moves = []
    for line in hlo.splitlines():
        match = re.search(r"= f32\[([\d,]+)\]\{[\d,]*\} (copy|transpose)\(", line)
        if match:
            dims = tuple(sorted(int(d) for d in match.group(1).split(",") if int(d) > 1))
            if dims in weight_shapes:
                moves.append(line.strip()[:160])
    return moves


def _batch(model, rows: int):
    # Batch 1 matters: it makes the logits layer a matrix-vector product, where the copy appeared.
    if model.is_encoder_decoder:
        return inputs.encoder_batch([[5, 6, 7, 1], [8, 9, 1]][:rows])
    return inputs.decoder_batch([[5, 6, 7, 8, 9], [10, 11]][:rows], pad_to=7)


# Batch 1 with a tied draft is where the copy appeared; an untied draft or a second row compiles
# the same logits layer as a plain matrix product (dropped from the default suite for its time).
@pytest.mark.parametrize(
    "family,tied_draft,rows",
    [
        ("decoder", True, 1),
        ("t5", True, 1),
        pytest.param("decoder", True, 2, marks=pytest.mark.slow),
        pytest.param("decoder", False, 1, marks=pytest.mark.slow),
    ],
)
def test_speculative_loop_moves_no_weights(family, tied_draft, rows):
    if family == "decoder":
        target, target_params = _decoder(EMB, 2, tied=False)
        draft, draft_params = _decoder(40, 1, tied=tied_draft)
    else:
        target, target_params = _t5(EMB, 2)
        draft, draft_params = _t5(EMB // 2, 1)
    config = decoding.DecodeConfig(16, 10**6, SamplingConfig(temperature=1.0), gamma=4)
    batch, rng = _batch(target, rows), jax.random.PRNGKey(0)
    lowered = decoding.speculative_loop.lower(
        target, target_params, draft, draft_params, batch, rng, config
    )
    hlo = lowered.compile().as_text()
    assert _weight_moves(hlo, _weight_shapes(target_params, draft_params)) == []


def test_autoregressive_loop_moves_no_weights():
    model, params = _decoder(EMB, 2, tied=True)
    config = decoding.DecodeConfig(16, 10**6, SamplingConfig())
    lowered = decoding.autoregressive_loop.lower(
        model, params, _batch(model, 1), jax.random.PRNGKey(0), config
    )
    hlo = lowered.compile().as_text()
    assert _weight_moves(hlo, _weight_shapes(params)) == []
