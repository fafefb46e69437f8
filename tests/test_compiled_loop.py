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

from speculative import decoding, inputs
from speculative.models import decoder, t5
from speculative.sampling import SamplingConfig

# Distinct sizes, so that no activation shape can be mistaken for a weight's.
VOCAB, EMB, MLP = 4099, 56, 113


def _abstract(model):
    return jax.eval_shape(model.init_params, jax.random.PRNGKey(0))


def _decoder(emb: int, layers: int, tied: bool):
    config = decoder.DecoderConfig(
        vocab_size=VOCAB,
        emb_dim=emb,
        num_layers=layers,
        num_heads=4,
        num_kv_heads=2,
        head_dim=emb // 4,
        mlp_dim=MLP,
        qkv_bias=True,
        tie_word_embeddings=tied,
        max_seq_len=128,
    )
    model = decoder.DecoderLM(config)
    return model, _abstract(model)


def _t5(emb: int, layers: int):
    config = t5.T5Config(
        vocab_size=VOCAB,
        emb_dim=emb,
        num_heads=4,
        num_encoder_layers=layers,
        num_decoder_layers=layers,
        head_dim=emb // 4,
        mlp_dim=MLP,
        mlp_activations=("gelu", "linear"),
        logits_via_embedding=True,
    )
    model = t5.T5(config)
    return model, _abstract(model)


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


@pytest.mark.parametrize(
    "family,tied_draft,rows",
    [("decoder", True, 1), ("decoder", True, 2), ("decoder", False, 1), ("t5", True, 1)],
)
def test_speculative_loop_moves_no_weights(family, tied_draft, rows):
    if family == "decoder":
        target, target_params = _decoder(EMB, 2, tied=False)
        draft, draft_params = _decoder(40, 1, tied=tied_draft)
    else:
        target, target_params = _t5(EMB, 2)
        draft, draft_params = _t5(EMB // 2, 1)
    args, static = decoding._speculative_args(
        target,
        target_params,
        draft,
        draft_params,
        _batch(target, rows),
        4,
        16,
        SamplingConfig(temperature=1.0),
        10**6,
        None,
    )
    hlo = decoding._speculative_jit.lower(*args, **static).compile().as_text()
    assert _weight_moves(hlo, _weight_shapes(target_params, draft_params)) == []


def test_autoregressive_loop_moves_no_weights():
    model, params = _decoder(EMB, 2, tied=True)
    args, static = decoding._autoregressive_args(
        model, params, _batch(model, 1), 16, SamplingConfig(), 10**6, None
    )
    hlo = decoding._autoregressive_jit.lower(*args, **static).compile().as_text()
    assert _weight_moves(hlo, _weight_shapes(params)) == []
