"""The infer job's settings: `validate` an InferConfig once, then `resolve` it into one frozen
`Settings` (models / inputs / speculation / run, as T5X groups its configs) that everything
downstream reads. Plain decoding is `speculation is None`; nothing asks `cfg.speculative` again."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from speculative import decoding, vocab
from speculative.data.inputs import Example
from speculative.decoding.sampling import SamplingConfig
from speculative.errors import JobError, output_location
from speculative.jobs import common
from speculative.jobs import config as job_config
from speculative.jobs.config import InferConfig
from speculative.loading import specs as ml
from speculative.measure import planner
from speculative.outputs.job_io import examples_digest

log = logging.getLogger(__name__)

SLOT = "speculative.InferConfig."  # what a spec bound to the wrong slot is named by


def validate(cfg: InferConfig) -> decoding.SpeculationSpec | None:
    """Raises JobError for a config the job cannot run (before any weight or input is read);
    returns the speculation spec it checked (`spec_of`), which `resolve` takes as it is."""
    common.check_required(cfg, ("target", "vocabulary", "output_dir"))
    ml.validate_model_spec(cfg.target, "target", SLOT + "target", model_only=True)
    ml.validate_vocab_spec(cfg.vocabulary, "vocabulary", SLOT + "vocabulary")
    if cfg.speculative:
        if cfg.draft is None:
            raise JobError(
                "SPECULATIVE is on but no draft model is bound (speculative.InferConfig.draft)"
            )
        ml.validate_model_spec(cfg.draft, "draft", SLOT + "draft")
        ml.check_quantization(cfg.draft, "draft", cfg.partitioner)
        if cfg.draft_vocabulary is not None:
            slot = SLOT + "draft_vocabulary"
            ml.validate_vocab_spec(cfg.draft_vocabulary, "draft vocabulary", slot)
    job_config.check_gamma(cfg.gamma)
    spec = spec_of(cfg)  # every speculation setting, checked once (the spec), in the job's words
    job_config.note_lenience(cfg.lenience, greedy=cfg.sampling.greedy)
    if spec is not None:
        check_planning(cfg, spec)
    job_config.check_count("batch_size", cfg.batch_size)
    lengths = dict(cfg.feature_lengths)
    if set(lengths) != {"inputs", "targets"} or min(lengths.values()) < 1:
        raise JobError(
            f"feature_lengths must be {{'inputs': n, 'targets': m}} (>= 1), got {lengths}"
        )
    if (cfg.input_file is None) == (cfg.mixture_or_task_name is None):
        raise JobError("bind exactly one of INPUT_FILE and MIXTURE_OR_TASK_NAME")
    job_config.check_num_examples(cfg.num_examples)
    if cfg.multi_host and cfg.partitioner is None:
        raise JobError(
            "DISTRIBUTED (multi_host) needs a PARTITIONER mesh over every host's devices"
        )
    return spec


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def spec_of(cfg: InferConfig) -> decoding.SpeculationSpec | None:
    """The speculation settings (None: plain decoding), or a JobError naming the gin setting that
    cannot be used (`job_config.speculation_spec`). While GAMMA = 'auto' is planned its gamma is
    None, and its tree too while TREE = 'auto' is (the trees it may choose are checked here)."""
    if not cfg.speculative:  # unused; refused as ever if they could not run
        job_config.check_acceptance(cfg.acceptance, cfg.lenience)
        return None
    settings = (cfg.gamma_policy, cfg.lenience, cfg.acceptance, cfg.sampling)
    if cfg.tree == "auto":
        job_config.speculation_spec(None, (1,), *settings)
    tree = None if cfg.tree == "auto" else cfg.tree
    gamma = None if cfg.gamma == "auto" or tree is not None else cfg.gamma
    return job_config.speculation_spec(gamma, tree, *settings)


def check_planning(cfg: InferConfig, spec: decoding.SpeculationSpec) -> None:
    """Raises JobError for GAMMA = 'auto' without sane planner settings, or TREE = 'auto' without
    GAMMA = 'auto', or a fixed TREE with it; says that a fixed tree's depth is the gamma."""
    if cfg.gamma == "auto":
        if cfg.gamma_policy.kind != "fixed":  # the planner's cost model drafts gamma every round
            raise JobError(
                f"GAMMA = 'auto' plans a fixed gamma; it cannot plan for GAMMA_POLICY kind "
                f"{cfg.gamma_policy.kind!r}: bind an integer GAMMA with an adaptive policy"
            )
        gammas = cfg.planner_gammas
        if isinstance(gammas, (str, bytes)) or not gammas or not all(map(_is_count, gammas)):
            raise JobError(f"planner_gammas must be integers >= 1, got {gammas!r}")
        job_config.check_count("planner_warmup_gamma", cfg.planner_warmup_gamma)
        if cfg.multi_host:  # every host would have to time the models and agree on one choice
            raise JobError("GAMMA = 'auto' needs one host; bind an integer GAMMA with DISTRIBUTED")
    if cfg.tree == "auto":
        if cfg.gamma != "auto":
            raise JobError(
                f"TREE = 'auto' plans chains and trees with GAMMA = 'auto' (planner_gammas are "
                f"the depths it scores); bind GAMMA = 'auto', got GAMMA {cfg.gamma!r}"
            )
    elif spec.tree is not None:
        if cfg.gamma == "auto":
            raise JobError(
                "GAMMA = 'auto' plans chains (with TREE = 'auto', chains and trees); bind an "
                "integer GAMMA (or none) with a fixed TREE"
            )
        if cfg.gamma != spec.gamma:
            log.info(
                f"TREE: {spec.tree.describe()} proposes up to {spec.gamma} tokens a round "
                f"(GAMMA unused)"
            )


# ------------------------------------------------------------------------------------------------
# The resolved settings.


@dataclasses.dataclass(frozen=True)
class Models:
    """What is loaded, and where: partitioner is the made Partitioner (None: one device)."""

    target: ml.ModelSpec
    vocabulary: ml.VocabSpec
    partitioner: Any = None
    multi_host: bool = False


@dataclasses.dataclass(frozen=True)
class Inputs(common.InputLengths):
    """Where the examples come from and how long they may be (feature_lengths: inputs, targets)."""

    feature_lengths: Mapping[str, int]
    input_file: str | None
    input_field: str
    target_field: str | None
    mixture_or_task_name: str | None
    task_split: str
    task_setup: Callable[[], Any] | None
    task_module: str | None
    num_examples: int | None
    strict_inputs: bool
    chat: bool
    chat_template: str | None


@dataclasses.dataclass(frozen=True)
class Planning:
    """GAMMA = 'auto': the gammas the planner scores and the gamma of its warm-up decode. trees
    (TREE = 'auto'): token trees are scored too, from a probe tree's warm-up decode instead
    (`measure.tree_planner`; the gammas are then the depths scored)."""

    gammas: tuple[int, ...]
    warmup_gamma: int
    trees: bool = False

    def to_json(self) -> dict[str, Any]:
        fields = {"planner_gammas": list(self.gammas), "planner_warmup_gamma": self.warmup_gamma}
        # only when planning trees, so output dirs planned for chains keep resuming
        return {**fields, "tree": "auto"} if self.trees else fields


@dataclasses.dataclass(frozen=True)
class Speculation:
    """The draft and how it is used. spec: the speculation settings (`decoding.SpeculationSpec`:
    gamma or tree, gamma policy, lenience, acceptance rule); its gamma is None until the planner
    has chosen (GAMMA = 'auto': then `planning` is set). separate_model: the draft is a model of
    its own (a ModelSpec)."""

    draft: Any
    draft_vocabulary: ml.VocabSpec | None
    spec: decoding.SpeculationSpec
    separate_model: bool
    planning: Planning | None = None

    @property
    def planned(self) -> bool:
        return self.spec.gamma is None


@dataclasses.dataclass(frozen=True)
class Run:
    """How the job runs: batches, rng, sampling, outputs and what it measures."""

    output_dir: str
    batch_size: int
    seed: int
    sampling: SamplingConfig
    measure_c: bool
    progress: bool
    compilation_cache_dir: str | None


@dataclasses.dataclass(frozen=True)
class Settings:
    """The job's one resolved configuration; speculation is None for plain decoding."""

    models: Models
    inputs: Inputs
    speculation: Speculation | None
    run: Run

    @property
    def speculative(self) -> bool:
        return self.speculation is not None

    @property
    def planned(self) -> bool:
        """Whether the job picks gamma itself (GAMMA = 'auto', speculative)."""
        return self.speculation is not None and self.speculation.planned

    @property
    def spec(self) -> decoding.SpeculationSpec:
        """The speculation settings; plain decoding's are the defaults (gamma None)."""
        return decoding.SpeculationSpec() if self.speculation is None else self.speculation.spec

    @property
    def gamma(self) -> int | str | None:
        """gamma: 'auto' while planned, None for plain decoding."""
        return None if self.speculation is None else "auto" if self.planned else self.spec.gamma

    @property
    def draft(self) -> Any:
        """The draft's spec; None for plain decoding."""
        return None if self.speculation is None else self.speculation.draft

    @property
    def draft_vocabulary(self) -> ml.VocabSpec | None:
        return None if self.speculation is None else self.speculation.draft_vocabulary

    @property
    def lenience(self) -> float:
        """The acceptance rule's l: 1 (exact) for plain decoding."""
        return self.spec.lenience

    @property
    def exact(self) -> bool:
        return self.lenience == 1.0

    @property
    def acceptance(self) -> str:
        """The acceptance rule ('token' for plain decoding, which verifies nothing)."""
        return self.spec.acceptance

    @property
    def tree(self) -> decoding.TreeShape | None:
        """The token tree proposed each round (None: chains, or plain decoding)."""
        return self.spec.tree

    def with_plan(self, plan: planner.Plan) -> Settings:
        """The settings that decode: the planned gamma, or tree (its depth the gamma), or plain
        decoding (as SPECULATIVE = False)."""
        if plan.gamma is None:
            return dataclasses.replace(self, speculation=None)
        tree = None if plan.tree is None else decoding.TreeShape(plan.tree)
        spec = dataclasses.replace(self.spec, gamma=plan.gamma, tree=tree)
        return dataclasses.replace(
            self, speculation=dataclasses.replace(self.speculation, spec=spec)
        )

    def decode_config(self, vocabulary: vocab.Vocabulary) -> decoding.DecodeConfig:
        """The DecodeConfig of these settings (gamma None while planned: the planner sets it)."""
        stop_ids = vocab.stop_ids(vocabulary)
        return decoding.DecodeConfig.from_spec(
            self.spec, self.inputs.max_decode_len, stop_ids, self.run.sampling
        )


def _speculation(cfg: InferConfig, spec: decoding.SpeculationSpec | None) -> Speculation | None:
    if spec is None:
        return None
    planning = None
    if cfg.gamma == "auto":
        gammas = tuple(int(g) for g in cfg.planner_gammas)
        planning = Planning(gammas, cfg.planner_warmup_gamma, trees=cfg.tree == "auto")
    if cfg.sampling.greedy:  # greedy verification ignores l (note_lenience said so): exact rows
        spec = dataclasses.replace(spec, lenience=1.0)
    return Speculation(
        draft=cfg.draft,
        draft_vocabulary=cfg.draft_vocabulary,
        spec=spec,
        separate_model=common.is_separate_model(cfg.draft),
        planning=planning,
    )


def resolve(
    cfg: InferConfig, spec: decoding.SpeculationSpec | None, partitioner: Any = None
) -> Settings:
    """The Settings of a validated InferConfig; spec: what `validate` returned for it;
    partitioner: the mesh made from cfg.partitioner."""
    inputs = common.group(Inputs, cfg, feature_lengths=dict(cfg.feature_lengths))
    run = common.group(Run, cfg, output_dir=output_location(cfg.output_dir))
    models = Models(cfg.target, cfg.vocabulary, partitioner, cfg.multi_host)
    return Settings(models, inputs, _speculation(cfg, spec), run)


# ------------------------------------------------------------------------------------------------
# What the settings say in outputs.


def describe(s: Settings) -> dict[str, Any]:
    """The target, draft, speculative and gamma fields that summary.json and the fingerprint share."""
    return {
        "target": ml.describe(s.models.target),
        "draft": None if s.draft is None else ml.describe(s.draft),
        "speculative": s.speculative,
        "gamma": s.gamma,
        # only when not the paper's rule, so earlier output dirs keep resuming
        **({"acceptance": s.acceptance} if s.acceptance != "token" else {}),
        **({"tree": list(s.tree.parents)} if s.tree is not None else {}),
    }


def policy_fields(s: Settings) -> dict[str, Any] | None:
    return dataclasses.asdict(s.spec.gamma_policy) if s.speculative else None


def fingerprint(s: Settings, examples: Sequence[Example]) -> dict[str, Any]:
    """What determines every row's result: a restart must match it to resume."""
    return {
        **describe(s),
        # only when lossy, so exact runs resume in output dirs written before lenience existed
        **({"lenience": s.lenience} if not s.exact else {}),
        # likewise only when adaptive or planned: older output dirs keep resuming
        **({"gamma_policy": policy_fields(s)} if s.spec.gamma_policy.adaptive else {}),
        **(s.speculation.planning.to_json() if s.planned else {}),
        "sampling": dataclasses.asdict(s.run.sampling),
        "batch_size": s.run.batch_size,
        "feature_lengths": dict(s.inputs.feature_lengths),
        "seed": s.run.seed,
        "examples": len(examples),
        "inputs_sha256": examples_digest(examples),
    }
