"""A draft with another tokenizer under the partitioner (4 host devices): greedy speculative output
on a 2x2 and a 4x1 mesh equals unpartitioned plain decoding, tiny models over two trained
byte-level BPE vocabularies (the fixtures of tests/test_cross_vocab.py); the tables are replicated.

Needs XLA_FLAGS=--xla_force_host_platform_device_count=4 before JAX starts, so the default suite
runs this module in a subprocess (tests/test_cross_vocab_jobs.py); by hand:
    XLA_FLAGS=--xla_force_host_platform_device_count=4 .venv/bin/pytest tests/test_cross_vocab_sharded.py
"""

import jax
import numpy as np
import pytest

from speculative import decoding
from speculative.drafts import cross_vocab
from speculative.parallel import partitioning
from speculative.vocab.cross_tables import build_tables
from tests import helpers
from tests.test_cross_vocab import DRAFT_TEXT, TARGET_TEXT, V_MAX_LEN, _tiny, _trained

pytestmark = helpers.needs_host_devices("tests/test_cross_vocab_jobs.py", devices=4)


@pytest.fixture(scope="module")
def case():
    """(target (model, params), (drafter, params), batch of 8 ragged prompts, EOS, plain output)."""
    target_vocab = _trained(TARGET_TEXT, 300, "<|endoftext|>")
    draft_vocab = _trained(DRAFT_TEXT, 280, "</s>")
    target = _tiny(len(target_vocab.tokens), 32, layers=2, heads=4, kv_heads=2, seed=0)
    draft = _tiny(len(draft_vocab.tokens), 16, layers=1, heads=2, kv_heads=1, seed=1)
    drafter = cross_vocab.make_drafter(*draft, build_tables(draft_vocab, target_vocab))
    batch = helpers.ragged_prompts(0, batch=8, width=7, vocab=len(target_vocab.tokens))
    free = decoding.autoregressive_decode(*target, batch, max_decode_len=V_MAX_LEN, eos_id=0)
    eos = int(free.tokens[0, 6])  # emitted mid-sequence: rows stop inside blocks
    ref = decoding.autoregressive_decode(*target, batch, max_decode_len=V_MAX_LEN, eos_id=eos)
    return target, drafter, batch, eos, ref


@pytest.mark.parametrize("mesh", [(2, 2), (4, 1)], ids=["2x2", "4x1"])
def test_greedy_cross_vocabulary_identical_to_unpartitioned_plain(case, mesh):
    target, (drafter, params), batch, eos, ref = case
    partitioner = partitioning.create_partitioner(*mesh)
    out = decoding.speculative_decode(
        *target, drafter, params, batch, gamma=3, max_decode_len=V_MAX_LEN, eos_id=eos,
        partitioner=partitioner,
    )  # fmt: skip
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    assert np.all(np.asarray(out.stats.drafted) > 0)
    placed = drafter.place_params(partitioner, params)
    assert all(t.sharding.is_fully_replicated for t in jax.tree.leaves(placed["tables"]))
