"""Gin-configurable settings of the jobs (`speculative.infer`, `speculative.benchmark`).

Kept apart from the job modules so that `python -m speculative.infer` (which runs infer.py as
__main__) never registers a configurable twice, and so that configs can be built and checked
without importing any job code. Importing this module registers everything a job config binds.
Building these dataclasses reads no weights.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gin

# Imported for their gin registrations: job configs bind t5.*, decoder.*, sampling.*,
# partitioning.create_partitioner, distributed.initialize and speculative.ModelSpec / VocabSpec,
# so every job that parses a config imports this module.
from speculative.config import configurables  # noqa: F401
from speculative.data import seqio_inputs  # noqa: F401
from speculative.decoding import GammaPolicy
from speculative.decoding import acceptance as acceptance_rules
from speculative.decoding.sampling import SamplingConfig
from speculative.decoding.spec import SpecError, SpeculationSpec
from speculative.errors import JobError
from speculative.loading import specs as model_loading  # noqa: F401
from speculative.parallel import (
    distributed,  # noqa: F401
    partitioning,  # noqa: F401
)

log = logging.getLogger(__name__)

# Draft tokens per round of a chain when none is given: InferConfig.gamma's default, configs/runs/
# infer.gin's GAMMA and `Pair.generate`'s without a tree.
DEFAULT_GAMMA = 4


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
    """The decode a job that takes names runs (the Spec-Bench and certificate jobs' configs extend
    it), as `Pair.generate` takes it: max_new_tokens, gamma (None: DEFAULT_GAMMA for a chain, the
    depth for a tree), gamma_policy (a `decoding.GammaPolicy`; None: fixed), tree, acceptance,
    temperature / top_k / top_p and the seed. Checked once, by `jobs.pairs.decode_configs`."""

    max_new_tokens: int = 256
    gamma: int | None = None
    gamma_policy: Any = None
    tree: Any = None
    acceptance: str = "token"
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0


@gin.configurable(module="speculative")
@dataclasses.dataclass(frozen=True)
class InferConfig:
    """Everything the inference job does. See configs/runs/infer.gin for the macros.

    input_file: a .jsonl / .jsonl.gz / .tsv path or "humaneval"; or mixture_or_task_name (seqio).
    feature_lengths: {"inputs": max input tokens (longer inputs are truncated: encoder inputs keep
      their start, as seqio does; decoder prompts keep their end, where generation continues),
      "targets": tokens generated at most per example}.
    task_setup: a callable run before the seqio lookup (e.g. @speculative.seqio_tsv_task), for
      tasks defined in gin; task_module: a module imported for its task registrations (T5X style).
    num_examples: the first n examples (None: all; otherwise >= 1).
    draft: a ModelSpec, or a DraftSpec (configs/drafts/*.gin) for a draft that is not a model.
    lenience: l in (0, 1] of the acceptance rule; 1 is exact, l < 1 is lossy (rows say exact: false).
    acceptance: the rule that keeps draft tokens: 'token' (the paper's, default) or 'block' (block
      verification: exact, never fewer tokens accepted; needs lenience 1).
    tree: None (a chain of gamma drafts), or a token tree proposed each round: widths per depth
      such as (4, 2, 2, 1, 1), or {'parents': (...)} (`decoding.tree`); gamma is then its depth.
      'auto' (with gamma 'auto'): the planner chooses a chain, a tree of first children or plain
      decoding from the sibling ranks accepted on a probe tree (4 per depth, depth
      max(planner_gammas)) decoding batch 0 and the verify cost timed per node count
      (`measure.tree_planner`; docs/design.md); planner_warmup_gamma is then unused.
    gamma: draft tokens per round (an int >= 1), or 'auto': `speculative.planner` picks gamma, or
      plain decoding, from alpha on a warm-up decode of batch 0 at planner_warmup_gamma and the
      step / verify costs measured at batch_size, scoring each of planner_gammas (ignored with
      speculative False). The choice is kept in output_dir/plan.json for a resume.
    gamma_policy: `decoding.GammaPolicy`, how many of the gamma slots each row drafts per round.
    strict_inputs: refuse an input longer than feature_lengths["inputs"] instead of truncating it
      (a truncated row records `truncated_from` and the `inputs_used`, and the summary counts them).
    chat: ask each input through the target's chat template as a user turn (a JSONL input field
      that is a list of {"role", "content"} messages: that conversation), the assistant's turn
      opened (`data.chat_inputs`); chat_template: another template (text or a .jinja path) than
      the model's own. Decoder-only targets.
    partitioner: None (one device, unsharded) or `@partitioning.create_partitioner()` (a
      ('data', 'model') mesh; batch_size must divide by 'data'); see docs/tpu.md.
    multi_host: the job runs on every host of a pod slice (`distributed.initialize`); each host
      feeds its rows of each batch, process 0 alone writes the outputs. Needs a partitioner.
    compilation_cache_dir: JAX's persistent compilation cache: 'auto' (<parent of output_dir>/
      jax_cache; configs/runs/*.gin bind it), a directory, or None / '' (off, the default here).
    """

    target: Any = gin.REQUIRED
    draft: Any = None
    vocabulary: Any = gin.REQUIRED
    draft_vocabulary: Any = None
    output_dir: str = gin.REQUIRED
    speculative: bool = True
    gamma: int | str = DEFAULT_GAMMA
    gamma_policy: GammaPolicy = GammaPolicy()
    planner_gammas: Sequence[int] = (1, 2, 3, 4, 5, 6, 7, 8)
    planner_warmup_gamma: int = 4
    lenience: float = 1.0
    acceptance: str = "token"
    tree: Any = None
    sampling: SamplingConfig = SamplingConfig()
    batch_size: int = 1
    feature_lengths: Mapping[str, int] = dataclasses.field(
        default_factory=lambda: {"inputs": 512, "targets": 64}
    )
    input_file: str | None = None
    input_field: str = "inputs"
    target_field: str | None = "targets"
    mixture_or_task_name: str | None = None
    task_split: str = "validation"
    task_setup: Callable[[], Any] | None = None
    task_module: str | None = None
    num_examples: int | None = None
    seed: int = 0
    measure_c: bool = True
    progress: bool = True
    strict_inputs: bool = False
    chat: bool = False
    chat_template: str | None = None
    partitioner: Any = None
    multi_host: bool = False
    compilation_cache_dir: str | None = None


def check_count(name: str, value: Any) -> None:
    """Raises JobError unless value is an integer >= 1 (a bool is not): BATCH_SIZE, REPEATS, ..."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise JobError(f"{name} must be an integer >= 1, got {value!r}")


def check_gamma(gamma: Any, auto: bool = True) -> None:
    """Raises JobError unless GAMMA is an integer >= 1, or 'auto' where the caller plans it."""
    if auto and gamma == "auto":
        return
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        either = " or 'auto'" if auto else ""
        raise JobError(f"GAMMA must be an integer >= 1{either}, got {gamma!r}")


def check_sampling(temperature: Any, top_k: Any, top_p: Any) -> SamplingConfig:
    """The SamplingConfig of TEMPERATURE / TOP_K / TOP_P, or a JobError saying which is wrong."""
    try:
        return SamplingConfig(float(temperature), top_k, top_p)
    except (TypeError, ValueError) as e:
        raise JobError(f"sampling: {e}") from None


def check_num_examples(value: Any) -> None:
    """Raises JobError unless NUM_EXAMPLES is None (all examples) or an integer >= 1."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise JobError(
            f"NUM_EXAMPLES must be None (all examples) or an integer >= 1, got {value!r}"
        )


# ------------------------------------------------------------------------------------------------
# seqio hooks (seqio is an optional extra; nothing here imports it unless a task is used).


def seqio_tasks_module():
    """speculative.data.seqio_tasks, or a JobError saying how to install seqio."""
    seqio_inputs.require_seqio()
    return importlib.import_module("speculative.data.seqio_tasks")


@gin.configurable(module="speculative")
def seqio_tsv_task(
    name: str = gin.REQUIRED,
    path: str = gin.REQUIRED,
    prefix: str = "",
    vocabulary: str = "byte",
    split: str = "validation",
) -> str:
    """Registers a seqio Task over a local TSV of (input, target) pairs; returns its name."""
    return seqio_tasks_module().add_tsv_task(name, path, prefix, vocabulary, split)


@gin.configurable(module="speculative")
def ende_task(data_dir: str = "data/ende", vocabulary: str = "data/ende/spm.model") -> str:
    """Registers the EnDe reproduction's Task `speculative_ende_mini` over the splits that
    `python -m speculative.ende_data` wrote (configs/repro/base.gin); returns its name."""
    return seqio_tasks_module().add_ende_task(data_dir, vocabulary)


@gin.configurable(module="speculative")
def paper_tasks(vocabulary: str | None = None) -> None:
    """Registers the Table 2 tasks (speculative_wmt_t2t_ende, speculative_cnn_dailymail)."""
    module = seqio_tasks_module()
    module.add_paper_tasks(vocabulary or module.T5_VOCABULARY)


@gin.configurable(module="speculative")
@dataclasses.dataclass(frozen=True)
class BenchmarkConfig:
    """Plain vs speculative decoding of one target on the same prompts, in one run.

    Sweeps every (temperature, batch size, gamma); each timed point is the median of `repeats`
    runs after one warm-up run (every run kept for its speedup's bootstrap interval), with
    compilation timed apart. Batch sizes that do not fit in
    memory are recorded as skipped. input_file: as InferConfig ("humaneval" or a JSONL/TSV file);
    the first num_examples inputs (None: all) are used, cycled to fill a batch larger than them.
    chat, chat_template: as InferConfig (each input asked through the chat template).
    """

    target: Any = gin.REQUIRED
    draft: Any = gin.REQUIRED
    vocabulary: Any = gin.REQUIRED
    draft_vocabulary: Any = None
    output_dir: str = gin.REQUIRED
    input_file: str = "humaneval"
    input_field: str = "inputs"
    num_examples: int | None = 8
    chat: bool = False
    chat_template: str | None = None
    feature_lengths: Mapping[str, int] = dataclasses.field(
        default_factory=lambda: {"inputs": 512, "targets": 64}
    )
    gammas: Sequence[int] = (1, 2, 3, 4, 5, 6)
    lenience: float = 1.0
    acceptance: str = "token"  # the default variant's rule (`decoding.acceptance.names`)
    temperatures: Sequence[float] = (0.0, 1.0)
    top_k: int = 0
    top_p: float = 1.0
    batch_sizes: Sequence[int] = (1, 4, 16, 64)
    repeats: int = 3
    seed: int = 0
    partitioner: Any = None
    compilation_cache_dir: str | None = None
    # Speculative variants swept against one shared plain baseline per cell (None: one variant,
    # `draft` at `gammas` with `lenience`, as before); score_outputs: each program's outputs get
    # the target's mean log-probability per generated token (untimed); certify_outputs: at T > 0,
    # each program's outputs go through the exactness certificate's tests (untimed,
    # `measure.certificate`: every emitted token scored teacher-forced), plain's the control.
    variants: Sequence[Variant] | None = None
    score_outputs: bool = False
    certify_outputs: bool = False


@gin.configurable(module="speculative")
@dataclasses.dataclass(frozen=True)
class Variant:
    """One speculative setting of a benchmark sweep (BenchmarkConfig.variants), timed against
    the cell's shared plain baseline.

    name: unique, labels its points. draft: a ModelSpec or DraftSpec (None: BenchmarkConfig.draft;
    equal specs are loaded once). lenience: the acceptance rule's l (1 exact, < 1 lossy).
    gamma_policy: `decoding.GammaPolicy`. gammas: None = BenchmarkConfig.gammas. temperatures:
    the cells it runs in (None: all of BenchmarkConfig.temperatures; a subset of them).
    acceptance: 'token' (the paper's rule) or 'block' (block verification; lenience 1).
    tree: None (chains), or a token tree (widths per depth, e.g. (4, 2, 2, 1, 1)); its depth is
    then the variant's one gamma.
    """

    name: str = gin.REQUIRED
    draft: Any = None
    lenience: float = 1.0
    gamma_policy: GammaPolicy = GammaPolicy()
    acceptance: str = "token"
    tree: Any = None
    gammas: Sequence[int] | None = None
    temperatures: Sequence[float] | None = None


def note_lenience(lenience: float, greedy: bool = False) -> None:
    """Warns that l < 1 is lossy, or, for a greedy job (temperature 0), that it is ignored: greedy
    verification accepts a draft token exactly when it is the target's arg-max, whatever l is, so
    the output stays exact. (`speculation_spec` has checked that 0 < l <= 1.)"""
    if lenience < 1 and greedy:
        log.info(
            f"note: lenience {lenience} is ignored at temperature 0 (greedy verification keeps a "
            "draft token only where it is the target's arg-max): outputs are exact"
        )
    elif lenience < 1:
        log.warning(
            f"lenience {lenience} < 1: lenient acceptance is LOSSY, outputs are not "
            "samples of the target (rows and summaries say exact: false)"
        )


def speculation_spec(
    gamma: int | None,
    tree: Any,
    gamma_policy: Any,
    lenience: Any,
    acceptance: Any,
    sampling: SamplingConfig | None = None,
) -> SpeculationSpec:
    """The `SpeculationSpec` of GAMMA (None: a tree's depth, or not chosen yet), TREE,
    GAMMA_POLICY, LENIENCE and ACCEPTANCE (and, given, its check of the job's sampling), or a
    one-line JobError naming the gin setting it refuses. The spec does every check (the one place,
    as DecodeConfig's); this only words its refusal as the job's."""
    try:
        spec = SpeculationSpec(gamma, tree, gamma_policy, lenience, acceptance)
        if sampling is not None:
            spec.check_sampling(sampling)
        return spec
    except SpecError as e:
        raise JobError(_in_job_words(e, acceptance, lenience, gamma_policy)) from None


# How the jobs word each `SpecError.setting` (`_in_job_words`); gamma and lenience: the spec's
# own words, which name them.
_JOB_WORDS = {
    "tree": "TREE: {e}",
    "tree_rule": "TREE is verified by the exact tree rule: it needs ACCEPTANCE in {tree_rules}, "
    "LENIENCE 1 and the fixed GAMMA_POLICY, got {acceptance!r}, {lenience}, {gamma_policy}",
    "acceptance": "ACCEPTANCE must be one of {rules}, got {acceptance!r}",
    "chain_rule": "ACCEPTANCE {acceptance!r} verifies token trees only: set TREE, or use one of "
    "{chain_rules} for chains",
    "lenient": "ACCEPTANCE {acceptance!r} is exact only; LENIENCE {lenience} needs {lenient_rules}",
    "gamma_policy": "GAMMA_POLICY must be a @decoding.GammaPolicy(), got {gamma_policy!r}",
    "adaptive": "GAMMA_POLICY: {e}",
    "sampling": "ACCEPTANCE: {e}",
}


def _in_job_words(e: SpecError, acceptance: Any, lenience: Any, gamma_policy: Any) -> str:
    """A SpecError as the jobs say it: with the gin names of the settings refused."""
    names = acceptance_rules.names
    return _JOB_WORDS.get(e.setting, "{e}").format(
        e=e, acceptance=acceptance, lenience=lenience, gamma_policy=gamma_policy, rules=names(),
        tree_rules=names(True), chain_rules=names(False), lenient_rules=names(False, lenient=True),
    )  # fmt: skip


def check_acceptance(acceptance: Any, lenience: Any) -> None:
    """Raises the JobError `speculation_spec` words unless ACCEPTANCE names a rule
    (`decoding.acceptance.RULES`) that can take LENIENCE (for chains; a rule for trees alone on
    a tree, where lenience must be 1)."""
    tree_only = acceptance in set(acceptance_rules.names(True)) - set(acceptance_rules.names(False))
    speculation_spec(None, (1,) if tree_only else None, GammaPolicy(), lenience, acceptance)
