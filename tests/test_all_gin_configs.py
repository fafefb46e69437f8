"""Every gin file under configs/ parses and binds; job configs build their models (no weights).

- configs/models/**: the file's MODEL builds (tests/test_gin_configs.py checks the sizes).
- job configs (they include configs/runs/*.gin, or are those): parsed the way the jobs parse
  them, with every `%gin.REQUIRED` macro bound to None (checkpoint paths, output dir), then the
  job's config object is built; fragments (model files for the jobs) are parsed after
  configs/runs/infer.gin.
- configs/paper/**: the Table 2 rows: XXL target, the row's draft size (equal to the
  configs/models/t5_1_1 file of that size), dataset task, temperature, gamma, batch 1.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re

import gin
import pytest

from speculative.checkpoints import families
from speculative.config import configurables, gin_flags
from speculative.drafts import registry
from speculative.errors import JobError
from speculative.jobs import config as job_config
from speculative.jobs.certify import config as certify_config
from speculative.jobs.spec_bench import config as spec_bench_config
from speculative.loading import specs as model_loading
from speculative.models import t5

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").rglob("*.gin"))

# (dataset, temperature, draft size) -> gamma, as in Table 2 of the paper.
TABLE_2 = {
    ("ende", 0, "small"): 7,
    ("ende", 0, "base"): 7,
    ("ende", 0, "large"): 7,
    ("ende", 1, "small"): 7,
    ("ende", 1, "base"): 5,
    ("ende", 1, "large"): 3,
    ("cnndm", 0, "small"): 5,
    ("cnndm", 0, "base"): 5,
    ("cnndm", 0, "large"): 3,
    ("cnndm", 1, "small"): 5,
    ("cnndm", 1, "base"): 3,
    ("cnndm", 1, "large"): 3,
}
TASKS = {"ende": "speculative_wmt_t2t_ende", "cnndm": "speculative_cnn_dailymail"}


def _rel(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT))


def _includes_a_run(path: pathlib.Path) -> bool:
    """Whether the file includes configs/runs/*.gin, directly or through its includes."""
    text = path.read_text()
    included = re.findall(r"^include '([^']+)'", text, flags=re.M)
    return any(i.startswith("configs/runs/") or _includes_a_run(ROOT / i) for i in included)


def _job_files(path: pathlib.Path) -> list[str]:
    if _rel(path).startswith("configs/runs/") or _includes_a_run(path):
        return [_rel(path)]
    return ["configs/runs/infer.gin", _rel(path)]  # a models fragment for the jobs


def _parse_binding_required_to_none(files: list[str]) -> None:
    """Parses as the jobs do; REQUIRED macros (paths, output dir) are bound to None."""
    try:
        gin_flags.parse_gin(files)
        return
    except JobError as e:
        match = re.search(r"not set: ([\w, ]+)\.", str(e))
        if not match:
            raise
        missing = match.group(1).split(", ")
    gin_flags.parse_gin(files, [f"{name} = None" for name in missing])


def _job_config():
    text = gin.config_str()
    if "SpecBenchConfig" in text:
        return spec_bench_config.SpecBenchConfig()
    if "CertifyConfig" in text:
        return certify_config.CertifyConfig()
    if "BenchmarkConfig.target" in text:  # configs/drafts/* bind the draft of both jobs
        return job_config.BenchmarkConfig()
    return job_config.InferConfig()


def _isolated_model(gin_file: str):
    gin.clear_config()
    try:
        return configurables.build_model([gin_file], search_path=str(ROOT))
    finally:
        gin.clear_config()


@pytest.fixture(autouse=True)
def _clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def test_configs_found():
    names = {_rel(p) for p in CONFIGS}
    assert {"configs/runs/infer.gin", "configs/runs/benchmark.gin"} <= names
    assert len([n for n in names if n.startswith("configs/paper/") and "drafts" not in n]) == 13
    assert any(n.startswith("configs/demo/") for n in names)


# configs/train overlays (added after a model config) -> the model config to test them with.
TRAIN_OVERLAYS = {"configs/train/ende_big.gin": "configs/train/ende_target_regularised.gin"}


def _check_train_config(path: pathlib.Path) -> None:
    """configs/train/*: a speculative.TrainConfig with a T5 model and a vocabulary, or a
    speculative.HeadTrainConfig with a target ModelSpec."""
    from speculative import train_head  # register the job configs
    from speculative.jobs.train import run as trainer

    base = TRAIN_OVERLAYS.get(_rel(path))
    _parse_binding_required_to_none([base, _rel(path)] if base else [_rel(path)])
    if "HeadTrainConfig" in gin.config_str():
        head = train_head.HeadTrainConfig()
        assert isinstance(head.target, model_loading.ModelSpec)
        assert isinstance(head.vocabulary, model_loading.VocabSpec)
        return
    cfg = trainer.TrainConfig()
    assert isinstance(cfg.model, t5.T5) and isinstance(cfg.vocabulary, model_loading.VocabSpec)
    hash(cfg.model)
    assert cfg.steps >= 1 and cfg.batch_size >= 1
    if base:  # every file the model config read is rebound to the overlay's corpus
        read = (cfg.train_file, cfg.validation_file, cfg.vocabulary.path)
        assert all(f.startswith("data/ende_big/") for f in read), read


@pytest.mark.parametrize("path", CONFIGS, ids=_rel)
def test_gin_file_parses_and_binds(path):
    if _rel(path).startswith("configs/train/"):
        _check_train_config(path)
        return
    if _rel(path).startswith("configs/models/"):
        model = _isolated_model(_rel(path))
        assert model.vocab_size > 0
        return
    if _rel(path).startswith("configs/paper/drafts/"):
        files = ["configs/paper/base.gin", _rel(path)]  # a draft needs the target's base
    elif _rel(path) == "configs/paper/base.gin":  # and the base needs a draft
        files = [_rel(path), "configs/paper/drafts/t5_1_1_small.gin"]
    elif _rel(path).startswith("configs/repro/drafts/"):
        files = ["configs/repro/base.gin", _rel(path)]
    elif _rel(path) in ("configs/repro/base.gin", "configs/repro/models.gin"):
        files = ["configs/runs/infer.gin", _rel(path), "configs/repro/drafts/small.gin"]
    elif _rel(path) == "configs/repro/ende_big.gin":  # an overlay: after a row
        files = ["configs/repro/ende_t0_small.gin", _rel(path)]
    else:
        files = _job_files(path)
    _parse_binding_required_to_none(files)
    cfg = _job_config()
    for role in ("target", "draft"):
        spec = getattr(cfg, role)
        if isinstance(spec, model_loading.DraftSpec):  # configs/drafts/*: not a model
            assert role == "draft" and spec.kind in registry.names()
            model_loading.describe(spec)
            continue
        if spec is None or spec.format is None:  # configs/runs/*: format is a REQUIRED macro
            continue
        assert isinstance(spec, model_loading.ModelSpec) and spec.format in model_loading.FORMATS
        if spec.format == "random" or families.needs_model(spec.format):
            assert families.of_model(spec.model) is not None, role  # a registered family's
            hash(spec.model)  # a static jit argument
        else:
            assert spec.model is None, role  # architecture comes from the checkpoint
    if isinstance(
        cfg, spec_bench_config.SpecBenchConfig | certify_config.CertifyConfig
    ):  # vocabulary None: the target's own
        assert cfg.vocabulary is None or isinstance(cfg.vocabulary, model_loading.VocabSpec)
    elif not _rel(path).startswith(("configs/runs/", "configs/drafts/")):  # drafts: none
        assert isinstance(cfg.vocabulary, model_loading.VocabSpec)


@pytest.mark.parametrize("name", ["infer", "benchmark"])
def test_runs_files_mark_the_required_macros(name):
    with pytest.raises(JobError) as e:
        gin_flags.parse_gin([f"configs/runs/{name}.gin"])
    required = set(re.search(r"not set: ([\w, ]+)\.", str(e.value)).group(1).split(", "))
    assert required == {
        "TARGET_FORMAT",
        "TARGET_CHECKPOINT",
        "DRAFT_FORMAT",
        "DRAFT_CHECKPOINT",
        "VOCABULARY",
        "OUTPUT_DIR",
    }


@pytest.mark.parametrize("key, gamma", sorted(TABLE_2.items()), ids=lambda x: str(x))
def test_paper_rows(key, gamma):
    dataset, temperature, size = key
    _parse_binding_required_to_none([f"configs/paper/{dataset}_t{temperature}_{size}.gin"])
    cfg = job_config.InferConfig()
    xxl = _isolated_model("configs/models/t5_1_1/xxl.gin").config
    draft_size = _isolated_model(f"configs/models/t5_1_1/{size}.gin").config
    gin.clear_config()
    # DTYPE, the one dtype knob, makes weights and activations bfloat16 when the models load
    assert cfg.target.dtype == cfg.draft.dtype == "bfloat16"
    target = model_loading.with_dtype(cfg.target.model, cfg.target.dtype)
    assert target.config == dataclasses.replace(xxl, dtype="bfloat16")
    draft = model_loading.with_dtype(cfg.draft.model, cfg.draft.dtype)
    assert draft.config == dataclasses.replace(draft_size, dtype="bfloat16")
    assert (cfg.gamma, cfg.sampling.temperature, cfg.batch_size) == (gamma, temperature, 1)
    assert cfg.speculative and cfg.mixture_or_task_name == TASKS[dataset]
    assert cfg.input_file is None and cfg.task_setup is not None
    assert (cfg.target.format, cfg.draft.format) == ("t5x", "t5x")
    assert cfg.vocabulary.kind == "sentencepiece" and cfg.vocabulary.path.startswith(
        "gs://t5-data/"
    )


# configs/repro: draft name -> the configs/train file that trains it.
REPRO_DRAFTS = {
    "small": "ende_draft_small",
    "base": "ende_draft_base",
    "large": "ende_draft_large",
    "small_distilled": "ende_draft_small_distilled",
}


def _draft_checkpoint(draft: str) -> str:
    """The training run's directory (its best checkpoint is read); the distilled draft's last
    checkpoint, named (its validation loss is against the references, not what it learns)."""
    run = f"runs/ende/draft_{draft}"
    return f"{run}/checkpoint_1000" if draft == "small_distilled" else run


def _trained_model_config(name: str) -> t5.T5Config:
    """The model configs/train/<name>.gin trains."""
    from speculative.jobs.train import run as trainer

    gin.clear_config()
    _parse_binding_required_to_none([f"configs/train/{name}.gin"])
    cfg = trainer.TrainConfig()
    gin.clear_config()
    return cfg.model.config


@pytest.mark.parametrize("temperature", [0, 1])
@pytest.mark.parametrize("draft", [*REPRO_DRAFTS, "unigram", "bigram"])
def test_repro_rows_decode_the_models_the_trainer_trains(draft, temperature):
    target = _trained_model_config("ende_target")
    trained = _trained_model_config(REPRO_DRAFTS[draft]) if draft in REPRO_DRAFTS else None
    _parse_binding_required_to_none([f"configs/repro/ende_t{temperature}_{draft}.gin"])
    cfg = job_config.InferConfig()
    assert cfg.target.model.config == target and cfg.target.format == "t5x"
    # the training runs' directories (scripts/reproduce_ende.sh's OUTPUT_DIRs): the jobs read the
    # checkpoint each run's best_checkpoint.json names
    assert cfg.target.path == "runs/ende/target"
    if trained is None:
        assert isinstance(cfg.draft, model_loading.DraftSpec) and cfg.draft.kind == draft
        assert cfg.draft.tables == "runs/ende/ngram.npz"
    else:
        assert cfg.draft.model.config == trained and cfg.draft.format == "t5x"
        assert cfg.draft.path == _draft_checkpoint(draft)
    assert (cfg.sampling.temperature, cfg.batch_size, cfg.speculative) == (temperature, 1, True)
    assert cfg.mixture_or_task_name == "speculative_ende_mini" and cfg.task_split == "test"
    assert cfg.input_file is None and cfg.task_setup is job_config.ende_task
    assert cfg.vocabulary == model_loading.VocabSpec("sentencepiece", "data/ende/spm.model", 100)
    assert 1 <= cfg.gamma <= 8


def test_repro_benchmark_times_every_trained_draft():
    trained = {name: _trained_model_config(REPRO_DRAFTS[name]) for name in REPRO_DRAFTS}
    target = _trained_model_config("ende_target")
    _parse_binding_required_to_none(["configs/repro/benchmark.gin"])
    cfg = job_config.BenchmarkConfig()
    assert cfg.target.model.config == target
    variants = {v.name: v.draft for v in cfg.variants}
    assert set(variants) == {*REPRO_DRAFTS, "unigram", "bigram"}
    for name, config in trained.items():
        assert variants[name].model.config == config
        assert variants[name].path == _draft_checkpoint(name)
    assert cfg.input_file == "data/ende/test.jsonl" and cfg.batch_sizes == [1]


def test_repro_benchmark_takes_each_drafts_gamma_from_the_command_line():
    """scripts/reproduce_ende.sh's runs: the sweep on the validation split, then each draft at the
    one gamma chosen there, by the same flags (a draft without one keeps its sweep)."""
    flags = [
        "--gin.INPUT_FILE='data/ende/validation.jsonl'",
        "--gin.small/speculative.Variant.gammas=[3]",
        "--gin.bigram/speculative.Variant.gammas=[1]",
        "--gin.OUTPUT_DIR='unused'",
    ]
    bindings = [f.split("=", 1)[1] for f in gin_flags.rewrite_gin_args(flags)]
    gin_flags.parse_gin(["configs/repro/benchmark.gin"], bindings)
    cfg = job_config.BenchmarkConfig()
    assert cfg.input_file == "data/ende/validation.jsonl"
    gammas = {v.name: v.gammas for v in cfg.variants}
    assert gammas["small"] == [3] and gammas["bigram"] == [1]
    assert gammas["base"] is None and gammas["unigram"] == [1, 2, 3]  # GAMMAS / the file's


def test_paper_checkpoints_are_required_macros():
    with pytest.raises(JobError, match="DRAFT_CHECKPOINT, OUTPUT_DIR, TARGET_CHECKPOINT"):
        gin_flags.parse_gin(["configs/paper/ende_t0_small.gin"])


@pytest.mark.parametrize("draft", [*REPRO_DRAFTS, "bigram"])
def test_repro_big_corpus_overlay_rebinds_every_path(draft):
    """configs/repro/ende_big.gin after a row (CORPUS=big scripts/reproduce_ende.sh): the same
    models, every checkpoint, task file and vocabulary read from the larger corpus's runs."""
    # the regularised target's model, without its training-only dropout
    target = dataclasses.replace(_trained_model_config("ende_target_regularised"), dropout_rate=0.0)
    trained = _trained_model_config(REPRO_DRAFTS[draft]) if draft in REPRO_DRAFTS else None
    _parse_binding_required_to_none(
        [f"configs/repro/ende_t0_{draft}.gin", "configs/repro/ende_big.gin"]
    )
    cfg = job_config.InferConfig()
    assert cfg.target.model.config == target
    assert cfg.target.path == "runs/ende_big/target_regularised"
    if trained is not None:
        assert cfg.draft.model.config == trained
        assert cfg.draft.path.startswith(f"runs/ende_big/draft_{draft}")
    else:
        assert cfg.draft.tables == "runs/ende_big/ngram.npz"
    assert cfg.vocabulary.path == "data/ende_big/spm.model"
    assert cfg.compilation_cache_dir.startswith("runs/ende_big/")
    assert gin.query_parameter("speculative.ende_task.data_dir") == "data/ende_big"
    assert gin.query_parameter("speculative.ende_task.vocabulary") == "data/ende_big/spm.model"


def test_repro_big_corpus_overlay_rebinds_the_benchmarks_paths():
    _parse_binding_required_to_none(["configs/repro/benchmark.gin", "configs/repro/ende_big.gin"])
    cfg = job_config.BenchmarkConfig()
    assert cfg.target.path == "runs/ende_big/target_regularised"
    for variant in cfg.variants:
        where = getattr(variant.draft, "path", None) or variant.draft.tables
        assert where.startswith("runs/ende_big/"), (variant.name, where)
    assert cfg.vocabulary.path == "data/ende_big/spm.model"
