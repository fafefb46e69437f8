"""benchmark.json's header: the run itself (models, inputs) and the machine it ran on (device, jax,
XLA_FLAGS, the measured read bandwidth and the weight-streaming floor of one plain step)."""

from __future__ import annotations

import logging
import os
from typing import Any

import jax

from speculative.jobs import spmd as job_spmd
from speculative.jobs.benchmark.settings import Settings
from speculative.jobs.benchmark.setup import Setup
from speculative.measure import timing

log = logging.getLogger(__name__)


def header(s: Settings, setup: Setup) -> dict[str, Any]:
    """benchmark.json's fields about the run itself (models, inputs, machine), cells empty."""
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(setup.target.params))
    bandwidth = timing.read_bandwidth()
    log.info(
        f"target weights {weight_bytes / 1e9:.2f} GB, measured read bandwidth "
        f"{bandwidth / 1e9:.1f} GB/s -> weight-streaming floor "
        f"{1e3 * weight_bytes / bandwidth:.0f} ms per plain step"
    )
    partitioner = s.models.partitioner
    return {
        "target": setup.target.description,
        "draft": setup.draft.description,
        **({"drafts": [d.description for d in setup.all_drafts()]} if s.sweep.named else {}),
        "inputs": s.inputs.input_file,
        "num_examples": setup.num_examples,
        "feature_lengths": dict(s.inputs.feature_lengths),
        "truncated_inputs": setup.truncated,
        "vocab_padding": dict(setup.vocab_padding),
        "padded_input_width": setup.width,
        "repeats": s.run.repeats,
        "stop_ids": list(setup.stop_ids),
        "target_weight_bytes": weight_bytes,
        "read_bandwidth_bytes_s": bandwidth,
        "stream_floor_s_per_step": weight_bytes / bandwidth,
        "jax": jax.__version__,
        "device": str(jax.devices()[0]),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),  # they can change kernels, hence timings
        **({"partitioner": job_spmd.describe(partitioner)} if partitioner else {}),
        # False until the last cell is measured: a sweep cut short (killed, or an error) leaves
        # a benchmark.json that says it is partial; a rerun starts the sweep over.
        "complete": False,
        "cells": [],
        "skipped": [],
    }
