"""What every cell of the benchmark's sweep shares: the loaded models (`jobs.common`) and the
tokenized inputs (`Setup`), the batches of a batch size, and whether a batch size fits in memory."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from speculative import vocab
from speculative.data import chat_inputs, inputs
from speculative.jobs import common
from speculative.jobs.benchmark.settings import Settings
from speculative.loading import specs as ml
from speculative.measure import memory

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Setup:
    """The loaded models and tokenized inputs every cell of the sweep shares.

    ids: token ids per input; width: the bucket of the longest (what memory is planned for).
    truncated: inputs cut to the inputs feature length; vocab_padding: the padding ids masked out
    of both models ({} when none, see `model_loading.fit_vocabulary`). drafts: every distinct
    draft (`Models.drafts` of the settings, in order; drafts[0] is `draft`); empty: `draft` alone.
    """

    target: ml.Loaded
    draft: ml.Loaded
    stop_ids: tuple[int, ...]
    num_examples: int
    ids: list[list[int]]
    width: int
    truncated: int = 0
    vocab_padding: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    drafts: Sequence[ml.Loaded] = ()

    @property
    def encoder_decoder(self) -> bool:
        return self.target.model.is_encoder_decoder

    @property
    def draft_model(self) -> Any:
        """The draft as a model, or None for a `Drafter` that is not a separate model (no
        prefill, weights or cache of its own to account for)."""
        return common.model_of(self.draft)

    def all_drafts(self) -> list[ml.Loaded]:
        return list(self.drafts) or [self.draft]


def load(s: Settings) -> Setup:
    """The inputs, the vocabulary, the target and every distinct draft, fitted and shortlisted."""
    examples = inputs.read_examples(
        s.inputs.input_file, input_field=s.inputs.input_field, limit=s.inputs.num_examples
    )
    vocabulary = ml.load_vocabulary(s.models.vocabulary, "vocabulary")
    m = s.models
    examples = chat_inputs.prepare(  # before any weights load: a missing template fails fast
        examples, vocabulary, chat=s.inputs.chat, template=s.inputs.chat_template,
        encoder_decoder=ml.is_encoder_decoder(m.target),
    )  # fmt: skip
    loaded = common.load_models(
        m.target, m.drafts, vocabulary, m.vocabulary, m.draft_vocabulary, m.partitioner
    )
    cap = s.inputs.input_length
    encoded = inputs.encode(examples, vocabulary, loaded.target.model.is_encoder_decoder, cap)
    truncated = sum(e.truncated for e in encoded)
    if truncated:
        log.warning(
            f"{truncated} input(s) longer than {cap} tokens are truncated to their last {cap}"
        )
    ids = [e.ids for e in encoded]
    drafts = common.prepare_drafts(loaded, m.drafts, vocabulary, ids).drafts
    width = inputs.bucket(max(len(x) for x in ids), cap)
    stop_ids = vocab.stop_ids(vocabulary)
    return Setup(
        loaded.target, drafts[0], stop_ids, len(examples), ids, width, truncated,
        loaded.vocab_padding, drafts,
    )  # fmt: skip


def batches_of(setup: Setup, s: Settings, batch_size: int) -> list[dict[str, jax.Array]]:
    """ceil(N / B) batches cycling the N inputs, each padded to its own bucket (as the infer job
    does): padding every prompt to the longest would bill short prompts for a long prefill."""
    batches = []
    for rows in inputs.cycled_rows(len(setup.ids), batch_size):
        ids = [setup.ids[i] for i in rows]
        width = inputs.bucket(max(len(x) for x in ids), s.inputs.input_length)
        batches.append(inputs.make_batch(ids, setup.encoder_decoder, width))
    return batches


def available_bytes() -> int:
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def memory_shortfall(setup: Setup, s: Settings, batch_size: int) -> str | None:
    """Why `batch_size` cannot fit in this host's free memory, or None when it may.

    The weights are loaded already, so what must still fit is the decode state of both models and
    XLA's workspace at the largest gamma, as `speculative.memory` estimates them; the check skips
    batch sizes that clearly cannot fit, no more.
    """
    available = available_bytes()
    need, usable = 0, 0
    for draft in setup.all_drafts():  # one program runs at a time: the largest draft counts
        draft_model = common.model_of(draft)
        plan = memory.plan(
            setup.target.model,
            draft_model or setup.target.model,
            memory.Device("this host", available, 1),
            batch_size=batch_size,
            input_len=setup.width,
            max_decode_len=s.inputs.max_decode_len,
            gamma=s.sweep.max_gamma,
            param_dtype=common.param_dtype(setup.target),
            mesh_shape={"data": 1, "model": 1},
            usable_fraction=0.8,
        )
        draft_cache = plan.draft_cache if draft_model is not None else 0
        cross = common.cross_draft_parts(
            draft, None, batch_size, setup.width, s.inputs.max_decode_len, s.sweep.max_gamma,
            common.param_dtype(setup.target),
        )  # fmt: skip
        if cross is not None:  # a draft with its own tokenizer: its cache and its tables
            draft_cache = cross["draft cache"] + cross["tables"]
        need = max(need, plan.target_cache + draft_cache + plan.workspace)
        usable = plan.usable
    if need <= usable:
        return None
    return f"estimated {need / 2**30:.1f} GiB > 80% of available {available / 2**30:.1f} GiB"


def print_memory(setup: Setup, s: Settings) -> None:
    gamma, partitioner = s.sweep.max_gamma, s.models.partitioner
    mesh = None if partitioner is None else partitioner.mesh_shape
    dtype = common.param_dtype(setup.target)
    for batch_size in s.sweep.batch_sizes:
        report = memory.job_report(
            setup.target.model,
            setup.draft_model,  # the first draft's (variants' drafts are alike or smaller)
            batch_size=batch_size,
            input_len=setup.width,
            max_decode_len=s.inputs.max_decode_len,
            gamma=gamma,
            param_dtype=dtype,
            mesh_shape=mesh,
            draft_parts=common.cross_draft_parts(
                setup.draft, mesh, batch_size, setup.width, s.inputs.max_decode_len, gamma, dtype
            )  # a draft with its own tokenizer: its params, cache and tables
            or common.int8_draft_parts(setup.draft),  # int8 weights: its params as loaded
        )
        log.info(f"batch {batch_size}, gamma {gamma}: {report}")
