"""The benchmark job's settings: `validate` a BenchmarkConfig once, then `resolve` it into one
frozen `Settings` (models / inputs / sweep / run, as T5X groups its configs): the variants with
their defaults filled in, every gamma they run, the distinct drafts and which variant uses which.
Everything downstream reads it."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import gin

from speculative import decoding
from speculative.decoding.sampling import SamplingConfig
from speculative.errors import JobError, output_location
from speculative.jobs import common
from speculative.jobs import config as job_config
from speculative.jobs.config import BenchmarkConfig, Variant
from speculative.loading import specs as ml

log = logging.getLogger(__name__)

SLOT = "speculative.BenchmarkConfig."  # what a spec bound to the wrong slot is named by


def validate(cfg: BenchmarkConfig) -> None:
    """Raises JobError for a config the job cannot run (before any weight or input is read)."""
    common.check_required(cfg, ("target", "vocabulary", "output_dir"))
    ml.validate_model_spec(cfg.target, "target", SLOT + "target", model_only=True)
    if cfg.variants is None or any(v.draft is None for v in cfg.variants):
        if cfg.draft is gin.REQUIRED:
            raise JobError("speculative.BenchmarkConfig.draft is required")
        ml.validate_model_spec(cfg.draft, "draft", SLOT + "draft")
        ml.check_quantization(cfg.draft, "draft", cfg.partitioner)
    ml.validate_vocab_spec(cfg.vocabulary, "vocabulary", SLOT + "vocabulary")
    if cfg.draft_vocabulary is not None:
        slot = SLOT + "draft_vocabulary"
        ml.validate_vocab_spec(cfg.draft_vocabulary, "draft vocabulary", slot)
    # the default variant's settings (checked with VARIANTS too, as ever)
    job_config.speculation_spec(None, None, decoding.GammaPolicy(), cfg.lenience, cfg.acceptance)
    job_config.note_lenience(cfg.lenience)
    for name in ("gammas", "batch_sizes"):
        values = list(getattr(cfg, name))
        if not values or any(not isinstance(v, int) or v < 1 for v in values):
            raise JobError(f"{name} must be a non-empty list of integers >= 1, got {values}")
    if not list(cfg.temperatures) or any(t < 0 for t in cfg.temperatures):
        raise JobError(
            f"temperatures must be a non-empty list of values >= 0, got {cfg.temperatures}"
        )
    for temperature in cfg.temperatures:  # TOP_K / TOP_P refused now, not after loading weights
        job_config.check_sampling(temperature, cfg.top_k, cfg.top_p)
    job_config.check_count("repeats", cfg.repeats)
    job_config.check_num_examples(cfg.num_examples)
    if cfg.variants is not None:
        if cfg.lenience != 1:  # variants_of would drop it without a word
            raise JobError(
                f"LENIENCE {cfg.lenience} applies only without VARIANTS; give the variants their "
                "own lenience (speculative.Variant.lenience)"
            )
        validate_variants(cfg)


def validate_variants(cfg: BenchmarkConfig) -> None:
    """Raises a one-line JobError naming the first bad entry of cfg.variants."""
    if isinstance(cfg.variants, (str, Variant)) or not list(cfg.variants):
        raise JobError(f"variants must be None or a non-empty list of Variants, got {cfg.variants}")
    names, temperatures = set(), {float(t) for t in cfg.temperatures}
    for v in cfg.variants:
        if not isinstance(v, Variant):
            raise JobError(f"variants: expected speculative.Variant, got {type(v).__name__}")
        if not isinstance(v.name, str) or not v.name:
            raise JobError(f"variants: every variant needs a non-empty name, got {v.name!r}")
        if v.name in names:
            raise JobError(f"variant {v.name!r}: duplicate name")
        names.add(v.name)
        if v.draft is not None:
            slot = f"speculative.Variant.draft (variant {v.name!r})"
            ml.validate_model_spec(v.draft, f"variant {v.name!r} draft", slot)
            ml.check_quantization(v.draft, f"variant {v.name!r} draft", cfg.partitioner)
        variant_spec(v)  # its speculation settings, checked once (the spec)
        job_config.note_lenience(v.lenience)
        gammas = list(v.gammas) if v.gammas is not None else [1]
        if not gammas or any(
            isinstance(g, bool) or not isinstance(g, int) or g < 1 for g in gammas
        ):
            raise JobError(
                f"variant {v.name!r}: gammas must be a non-empty list of integers >= 1, "
                f"got {list(v.gammas)}"
            )
        temps = list(v.temperatures) if v.temperatures is not None else list(cfg.temperatures)
        outside = [t for t in temps if float(t) not in temperatures]
        if temps and len(outside) == len(temps):  # TEMPERATURES narrowed to split a sweep
            log.warning(f"variant {v.name!r} skipped: it runs at {temps}, none of TEMPERATURES")
        elif not temps or outside:
            raise JobError(
                f"variant {v.name!r}: temperatures {temps} must be a non-empty subset of "
                f"TEMPERATURES {list(cfg.temperatures)}"
            )
    for t in cfg.temperatures:  # a cell needs something to compare with its plain baseline
        if not any(v.temperatures is None or t in v.temperatures for v in cfg.variants):
            raise JobError(f"no variant runs at temperature {t}; drop it from TEMPERATURES")


def variants_of(cfg: BenchmarkConfig) -> list[Variant]:
    """cfg.variants with their defaults filled in (draft, gammas, temperatures), less those that
    run at none of cfg.temperatures; without variants, the one variant "default": cfg.draft at
    cfg.gammas with cfg.lenience."""
    if cfg.variants is None:
        return [
            Variant(
                "default", cfg.draft, float(cfg.lenience), acceptance=cfg.acceptance,
                gammas=tuple(cfg.gammas),
            )
        ]  # fmt: skip
    filled = [
        dataclasses.replace(
            v,
            draft=cfg.draft if v.draft is None else v.draft,
            gammas=_gammas(cfg, v),
            tree=tree_of(v),
            temperatures=None if v.temperatures is None else tuple(map(float, v.temperatures)),
        )
        for v in cfg.variants
    ]
    return [v for v in filled if any(runs_at(v, t) for t in cfg.temperatures)]


def variant_spec(variant: Variant, gamma: int | None = None) -> decoding.SpeculationSpec:
    """The variant's speculation settings at `gamma` (a tree's is its depth; None: a chain's
    gamma unset), or a JobError naming the variant and the setting refused."""
    try:
        return job_config.speculation_spec(
            None if variant.tree is not None else gamma, variant.tree, variant.gamma_policy,
            variant.lenience, variant.acceptance,
        )  # fmt: skip
    except JobError as e:
        raise JobError(f"variant {variant.name!r}: {e}") from None


def tree_of(variant: Variant) -> decoding.TreeShape | None:
    """The variant's token tree (None: chains)."""
    return variant_spec(variant).tree


def _gammas(cfg: BenchmarkConfig, variant: Variant) -> tuple[int, ...]:
    """A tree variant runs at its depth alone; a chain at its gammas (or GAMMAS)."""
    tree = tree_of(variant)
    if tree is not None:
        return (tree.depth,)
    return tuple(cfg.gammas if variant.gammas is None else variant.gammas)


def verify_tokens(variant: Variant, gamma: int) -> int:
    """Tokens a verify call of `variant` at `gamma` scores: a tree's nodes + 1, or gamma + 1."""
    return gamma + 1 if variant.tree is None else variant.tree.size + 1


def round_key(variant: Variant, gamma: int) -> tuple:
    """What a round's sampling work depends on besides the batch: rule, tree, lenience, gamma
    (the key of the costs' "sampling_round_s")."""
    return variant.acceptance, variant.tree, float(variant.lenience), gamma


def runs_at(variant: Variant, temperature: float) -> bool:
    return variant.temperatures is None or float(temperature) in variant.temperatures


def distinct_drafts(variants: Sequence[Variant]) -> list[Any]:
    """The variants' draft specs without repeats (equal specs share one loaded draft)."""
    specs: list[Any] = []
    for v in variants:
        if v.draft not in specs:
            specs.append(v.draft)
    return specs


# ------------------------------------------------------------------------------------------------
# The resolved settings.


@dataclasses.dataclass(frozen=True)
class Models:
    """The target, vocabularies, mesh (the made Partitioner, or None) and the distinct drafts as
    (role, spec): equal specs are loaded once; "draft" alone without variants."""

    target: ml.ModelSpec
    vocabulary: ml.VocabSpec
    draft_vocabulary: ml.VocabSpec | None
    partitioner: Any
    drafts: tuple[tuple[str, Any], ...]


@dataclasses.dataclass(frozen=True)
class Inputs(common.InputLengths):
    input_file: str
    input_field: str
    num_examples: int | None
    feature_lengths: Mapping[str, int]
    chat: bool = False
    chat_template: str | None = None


@dataclasses.dataclass(frozen=True)
class Sweep:
    """What is timed: every batch size and temperature (a cell), each variant running there at
    each of its gammas against the cell's plain baseline. variants: filled in (`variants_of`);
    named: bound through VARIANTS (benchmark.json then names them); gammas: every gamma any
    variant runs, sorted; draft_of: variant name -> index of its draft in Models.drafts; specs:
    (variant name, gamma) -> its speculation settings (`variant_spec`), its decodes' source."""

    variants: tuple[Variant, ...]
    named: bool
    gammas: tuple[int, ...]
    draft_of: Mapping[str, int]
    specs: Mapping[tuple[str, int], decoding.SpeculationSpec]
    batch_sizes: tuple[int, ...]
    temperatures: tuple[float, ...]
    top_k: int
    top_p: float
    score_outputs: bool
    certify_outputs: bool

    @property
    def max_gamma(self) -> int:
        return max(self.gammas)

    @property
    def verify_lengths(self) -> tuple[int, ...]:
        """Every verify call length the sweep runs (the step costs time each once), sorted."""
        return tuple(sorted({verify_tokens(v, g) for v in self.variants for g in v.gammas}))

    def at(self, temperature: float) -> list[Variant]:
        """The variants that run in a cell at `temperature`."""
        return [v for v in self.variants if runs_at(v, temperature)]

    def sampling(self, temperature: float) -> SamplingConfig:
        return SamplingConfig(float(temperature), self.top_k, self.top_p)


@dataclasses.dataclass(frozen=True)
class Run:
    output_dir: str
    repeats: int
    seed: int
    compilation_cache_dir: str | None


@dataclasses.dataclass(frozen=True)
class Settings:
    models: Models
    inputs: Inputs
    sweep: Sweep
    run: Run


def _draft_role(cfg: BenchmarkConfig, index: int) -> str:
    """How errors name the index-th distinct draft: "draft" alone without variants."""
    return "draft" if cfg.variants is None else f"draft {index + 1}"


def resolve(cfg: BenchmarkConfig, partitioner: Any = None) -> Settings:
    """The Settings of a validated BenchmarkConfig; partitioner: the mesh made from it."""
    variants = variants_of(cfg)
    specs = distinct_drafts(variants)
    drafts = tuple((_draft_role(cfg, i), spec) for i, spec in enumerate(specs))
    models = Models(cfg.target, cfg.vocabulary, cfg.draft_vocabulary, partitioner, drafts)
    inputs = Inputs(
        cfg.input_file, cfg.input_field, cfg.num_examples, dict(cfg.feature_lengths), cfg.chat,
        cfg.chat_template,
    )  # fmt: skip
    sweep = Sweep(
        variants=tuple(variants),
        named=cfg.variants is not None,
        gammas=tuple(sorted({g for v in variants for g in v.gammas})),
        draft_of={v.name: specs.index(v.draft) for v in variants},
        specs={(v.name, g): variant_spec(v, g) for v in variants for g in v.gammas},
        batch_sizes=tuple(cfg.batch_sizes),
        temperatures=tuple(cfg.temperatures),
        top_k=cfg.top_k,
        top_p=cfg.top_p,
        score_outputs=cfg.score_outputs,
        certify_outputs=cfg.certify_outputs,
    )
    run = Run(output_location(cfg.output_dir), cfg.repeats, cfg.seed, cfg.compilation_cache_dir)
    return Settings(models, inputs, sweep, run)
