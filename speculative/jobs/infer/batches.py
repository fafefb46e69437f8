"""The infer job's inputs: its examples, their token ids, and its fixed batches (rows
[k*B, (k+1)*B), batch k with rng fold_in(seed, k)) so that a row's result does not depend on where
a run stopped."""

from __future__ import annotations

import dataclasses
import importlib
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax

from speculative import vocab
from speculative.data import inputs, seqio_inputs
from speculative.data.inputs import Example
from speculative.errors import JobError
from speculative.jobs import spmd as job_spmd
from speculative.jobs.infer.settings import Inputs, Settings
from speculative.measure import runner

log = logging.getLogger(__name__)


def load_examples(s: Inputs) -> list[Example]:
    """The job's examples: the input file's, or the seqio Task's after its registration."""
    if s.input_file is not None:
        return inputs.read_examples(
            s.input_file,
            input_field=s.input_field,
            target_field=s.target_field,
            limit=s.num_examples,
        )
    seqio_inputs.require_seqio()
    if s.task_module:
        importlib.import_module(s.task_module)
    if s.task_setup is not None:
        s.task_setup()
    return seqio_inputs.read_task(s.mixture_or_task_name, s.task_split, s.num_examples)


def encode_inputs(
    s: Inputs, examples: Sequence[Example], vocabulary: vocab.Vocabulary, encoder_decoder: bool
) -> list[inputs.Encoded]:
    """Token ids of every example; with strict_inputs, a JobError for one longer than allowed."""
    limit = s.input_length
    encoded = inputs.encode(examples, vocabulary, encoder_decoder, limit)
    long = [(ex, e) for ex, e in zip(examples, encoded) if e.truncated]
    if long and s.strict_inputs:
        ex, e = long[0]
        where = ex.source or f"{s.mixture_or_task_name}[{ex.index}]"
        raise JobError(
            f"input {ex.index} has {e.full_length} tokens, more than the inputs feature length "
            f"{limit} (strict_inputs; {len(long)} input(s) too long): shorten it, raise "
            "TASK_FEATURE_LENGTHS['inputs'], or turn strict inputs off to truncate",
            role="input",
            path=where,
        )
    if long:
        log.warning(
            f"{len(long)} input(s) longer than {limit} tokens are truncated (first: input "
            f"{long[0][0].index}, {long[0][1].full_length} tokens); rows record truncated_from"
        )
    return encoded


def check_context(models: Sequence[Any], ids: Sequence[Sequence[int]], max_decode_len: int) -> None:
    """Raises JobError when a decoder-only prompt plus the generated tokens outgrow a model
    (models: the target's and the draft's model, if any)."""
    if models[0].is_encoder_decoder:
        return
    limits = [getattr(m, "max_length", None) for m in models]
    limits = [x for x in limits if x is not None]
    need = max(len(x) for x in ids) + max_decode_len
    if limits and need > min(limits):
        raise JobError(
            f"longest prompt + targets length = {need} tokens exceeds the model context "
            f"{min(limits)}"
        )


def pending_batches(count: int, batch_size: int, done: Mapping[int, Any]) -> list[int]:
    """Batch numbers k (rows [k*B, (k+1)*B)) with a row not written yet."""
    return [
        k
        for k in range(math.ceil(count / batch_size))
        if any(i not in done for i in range(k * batch_size, min(count, (k + 1) * batch_size)))
    ]


@dataclasses.dataclass(frozen=True)
class JobBatch:
    """Batch k of the job: its real rows (members) and the padded batch decoded for them."""

    number: int
    members: list[int]
    batch: dict[str, jax.Array]
    rng: jax.Array


def job_batches(
    s: Settings, ids: Sequence[Sequence[int]], todo: Sequence[int], decoder: runner.Decoder
) -> Iterator[JobBatch]:
    """The pending batches, built lazily: fixed rows [k*B, (k+1)*B) (a short last batch repeats its
    last row), each padded to its own bucket width, batch k with rng fold_in(seed, k). The runner
    checks each batch before decoding it (`invalid_batch` names the batch in the error)."""
    size, partitioner = s.run.batch_size, s.models.partitioner
    rows = inputs.consecutive_rows(len(ids), size)
    # On a mesh, this host builds only its rows (all of them on one host); the width is the
    # whole batch's, so every host pads alike.
    local = slice(None) if partitioner is None else job_spmd.local_rows(partitioner, size)
    for k in todo:
        members = list(dict.fromkeys(rows[k]))
        width = inputs.bucket(max(len(ids[i]) for i in members), s.inputs.input_length)
        batch = inputs.make_batch(
            [ids[i] for i in rows[k][local]], decoder.target.is_encoder_decoder, width
        )
        if partitioner is not None:
            batch = job_spmd.place_batch(partitioner, batch, size)
        yield JobBatch(k, members, batch, jax.random.fold_in(jax.random.PRNGKey(s.run.seed), k))


def invalid_batch(number: int, error: ValueError) -> JobError:
    """A batch the decoder refused (`runner.Decoder.validate`), as the job's one-line error."""
    return JobError(f"batch {number}: {error}")
