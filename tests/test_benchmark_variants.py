"""BenchmarkConfig.variants: several speculative settings against one shared plain baseline.

Tiny random-weight models (configs/demo/tiny_random_models.gin); checks labels, greedy identity,
lossy labelling and the target log-prob scoring, not speed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import gin
import pytest

from speculative import benchmark, fit_ngram
from speculative.config import gin_flags
from speculative.decoding import GammaPolicy
from speculative.errors import JobError
from speculative.jobs import config as job_config
from speculative.jobs.config import Variant
from speculative.loading import specs as ml
from speculative.measure import report as benchmark_report
from tests.helpers import tiny_decoder_model

ROOT = pathlib.Path(__file__).resolve().parents[1]

VARIANTS_GIN = """
VARIANTS = [
    @model/speculative.Variant(),
    @lookup/speculative.Variant(),
    @lenient/speculative.Variant(),
    @confident/speculative.Variant(),
    @block/speculative.Variant(),
    @tree/speculative.Variant(),
]
model/speculative.Variant:
  name = 'model'
  draft = @draft/speculative.ModelSpec()
  gammas = [3]
lookup/speculative.Variant:
  name = 'lookup'
  draft = @lookup/speculative.DraftSpec()
lookup/speculative.DraftSpec.kind = 'prompt_lookup'
lenient/speculative.Variant:
  name = 'lenient'
  draft = @draft/speculative.ModelSpec()
  lenience = 0.5
  temperatures = [1.0]
confident/speculative.Variant:
  name = 'confident'
  gamma_policy = @confident/decoding.GammaPolicy()
  gammas = [4]
confident/decoding.GammaPolicy.kind = 'confidence'
block/speculative.Variant:
  name = 'block'
  acceptance = 'block'
tree/speculative.Variant:
  name = 'tree'
  tree = (3, 2)
"""


@pytest.fixture(autouse=True)
def _cwd_repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def test_variants_share_one_plain_baseline_per_cell(tmp_path):
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('{"inputs": "abcabcabc"}\n{"inputs": "Hello, Hello"}\n')
    variants = tmp_path / "variants.gin"
    variants.write_text(VARIANTS_GIN)
    out = tmp_path / "bench"
    result = benchmark.main(
        [
            "--gin_file=configs/runs/benchmark.gin",
            "--gin_file=configs/demo/tiny_random_models.gin",
            f"--gin_file={variants}",
            f"--gin.INPUT_FILE='{inputs}'",
            f"--gin.OUTPUT_DIR='{out}'",
            "--gin.GAMMAS=[2]",
            "--gin.TEMPERATURES=[0.0, 1.0]",
            "--gin.BATCH_SIZES=[2]",
            "--gin.REPEATS=1",
            "--gin.SCORE_OUTPUTS=True",
            "--gin.CERTIFY_OUTPUTS=True",
            "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 8}",
        ]
    )
    assert json.loads((out / "benchmark.json").read_text())["cells"] == json.loads(
        json.dumps(result["cells"])
    )
    # model, lenient and confident share one loaded draft model; lookup is the second draft
    assert len(result["drafts"]) == 2 and "prompt_lookup" in result["drafts"][1]
    cells = {c["temperature"]: c for c in result["cells"]}
    assert sorted(cells) == [0.0, 1.0] and len(result["cells"]) == 2  # one baseline per cell
    labels = {T: [(p["variant"], p["gamma"]) for p in c["points"]] for T, c in cells.items()}
    exact = [("model", 3), ("lookup", 2), ("confident", 4), ("block", 2), ("tree", 2)]
    assert labels[0.0] == exact
    assert labels[1.0] == exact[:2] + [("lenient", 2)] + exact[2:]
    for T, cell in cells.items():
        assert set(cell["variants"]) == {v for v, _ in labels[T]}
        assert math.isfinite(cell["plain_target_mean_logprob"])
        for p in cell["points"]:
            assert p["exact"] == (p["variant"] != "lenient")
            assert p["lenience"] == (0.5 if p["variant"] == "lenient" else 1.0)
            assert math.isfinite(p["target_mean_logprob"]) and p["target_mean_logprob"] < 0
            assert p["c"] == pytest.approx(p["draft_step_s"] / cell["target_step_s"])
            assert ("prompt_lookup" in p["draft"]) == (p["variant"] == "lookup")
            kind = "confidence" if p["variant"] == "confident" else "fixed"
            assert p["gamma_policy"]["kind"] == kind
            # block verification and a token tree beside the chains (one sweep for all of them)
            assert p["acceptance"] == ("block" if p["variant"] == "block" else "token")
            tree = p["variant"] == "tree"
            assert p["tree"] == ([0, 0, 0, 1, 1] if tree else None)
            assert len(p["acceptance_by_position"]) == p["gamma"] or p["variant"] == "confident"
            # Every round is charged its own rule's sampling work, the tree's and block's too.
            assert p["round_sampling_s"] > 0
            if T == 0.0:  # exact greedy: plain's tokens, hence plain's score
                assert p["greedy_identical_to_plain"] is True
                assert p["target_mean_logprob"] == pytest.approx(
                    cell["plain_target_mean_logprob"], rel=1e-6
                )
            else:
                assert p["greedy_identical_to_plain"] is None
    # CERTIFY_OUTPUTS: at T = 1 each program's outputs through the certificate's tests (plain's
    # the control), scored token for token; greedy cells have identity instead
    assert "certificates" not in cells[0.0]
    found = cells[1.0]["certificates"]
    assert set(found) == {"plain"} | {f"{v} gamma {g}" for v, g in labels[1.0]}
    for name, tests in found.items():
        assert tests["tokens"] == sum(
            p["speculative_tokens"]
            for p in cells[1.0]["points"]
            if f"{p['variant']} gamma {p['gamma']}" == name
        ) or (name == "plain" and tests["tokens"] == cells[1.0]["points"][0]["plain_tokens"])
        assert 0.0 <= tests["uniformity"]["pvalue"] <= 1.0 and "stops" in tests
    table = benchmark_report.variant_table(result)
    assert table.count("\n") == 1 + 6 + 7  # header and rule, then plain + points per cell
    assert "| lenient | 1 | 2 |" in table and "| plain | 0 |" in table


def _cfg(**overrides) -> job_config.BenchmarkConfig:
    model = tiny_decoder_model(vocab=264, emb=32, layers=1, heads=2, kv_heads=1)
    spec = ml.ModelSpec("random", model=model)
    cfg = job_config.BenchmarkConfig(
        target=spec,
        draft=spec,
        vocabulary=ml.VocabSpec("byte"),
        output_dir="/unused",
        temperatures=(0.0, 1.0),
        variants=(Variant("a"), Variant("b", lenience=0.5, temperatures=(1.0,))),
    )
    return dataclasses.replace(cfg, **overrides)


@pytest.mark.parametrize(
    "variants, message",
    [
        ((Variant("a"), Variant("a")), "^variant 'a': duplicate name$"),
        ((Variant(""),), "non-empty name"),
        (
            (Variant("hot", temperatures=(0.5, 1.0)),),
            "^variant 'hot': temperatures .* subset of",
        ),
        ((Variant("zero", lenience=0.0),), r"^variant 'zero': lenience must be in \(0, 1\]"),
        ((Variant("g", gammas=(0,)),), "^variant 'g': gammas must be"),
        ((Variant("d", draft=ml.DraftSpec("nope")),), "^variant 'd' draft: unknown DraftSpec"),
        ((), "non-empty list of Variants"),
        ((Variant("hot", temperatures=(1.0,)),), "^no variant runs at temperature 0.0;"),
    ],
)
def test_bad_variants_are_one_line_errors(variants, message):
    with pytest.raises(JobError, match=message) as e:
        benchmark.validate(_cfg(variants=variants))
    assert "\n" not in str(e.value)


def test_good_variants_validate_and_fill_defaults():
    cfg = _cfg(gammas=(2, 3))
    benchmark.validate(cfg)
    a, b = benchmark.variants_of(cfg)
    assert a.draft == cfg.draft and a.gammas == (2, 3) and a.temperatures is None
    assert b.temperatures == (1.0,) and not benchmark.runs_at(b, 0.0)
    assert benchmark.distinct_drafts([a, b]) == [cfg.draft]  # equal specs: one draft
    assert benchmark.variants_of(_cfg(variants=None))[0].name == "default"
    assert isinstance(a.gamma_policy, GammaPolicy)


def test_narrowed_temperatures_skip_the_variants_that_run_at_none_of_them(caplog):
    cfg = _cfg(temperatures=(0.0,))  # a T = 0 half of a sweep whose variant "b" is T = 1 only
    benchmark.validate(cfg)
    skipped = "variant 'b' skipped: it runs at [1.0], none of TEMPERATURES"
    assert [r.levelname for r in caplog.records if r.getMessage() == skipped] == ["WARNING"]
    assert [v.name for v in benchmark.variants_of(cfg)] == ["a"]


@pytest.mark.parametrize("name", ["qwen_coder_drafts.gin", "qwen_coder_gamma_policies.gin"])
def test_qwen_variant_configs_parse_without_weights(name):
    gin.clear_config()
    try:
        gin_flags.parse_gin([f"configs/demo/{name}"], ["OUTPUT_DIR = '/unused'"])
        cfg = job_config.BenchmarkConfig()
    finally:
        gin.clear_config()
    names = [v.name for v in cfg.variants]
    if name == "qwen_coder_drafts.gin":
        assert names == [
            "0.5b",
            "unigram",
            "bigram",
            "prompt_lookup",
            "layer_skip_4",
            "layer_skip_8",
            "lenient_0.5",
            "lenient_0.3",
            "lenient_0.1",
        ]
        assert cfg.score_outputs and cfg.temperatures == [0.0, 1.0]
        by_name = {v.name: v for v in cfg.variants}
        assert by_name["0.5b"].draft.shortlist == 32768
        assert by_name["lenient_0.1"].draft == by_name["0.5b"].draft  # loaded once
        assert by_name["lenient_0.3"].temperatures == [1.0]
        assert by_name["bigram"].draft.tables.startswith("~/")
        assert by_name["layer_skip_8"].draft.num_layers == 8
    else:
        assert names == ["fixed", "confidence", "schedule"]
        assert cfg.variants[1].gamma_policy == GammaPolicy("confidence", threshold=0.4)
        assert cfg.variants[2].gamma_policy.kind == "schedule"
        assert cfg.batch_sizes == [1, 8] and cfg.temperatures == [0.0]


def test_fit_ngram_counts_the_python_standard_library(tmp_path):
    out = tmp_path / "sub" / "stdlib.npz"
    argv = ["--vocab_kind=byte", "--input_file=python_stdlib", "--stdlib_bytes=20000"]
    assert fit_ngram.main(argv + ["--vocab_size=264", f"--out={out}"]) == 0
    from speculative.drafts import ngram

    tables = ngram.load(out)
    assert tables.unigram.shape == (264,)
    assert float(tables.unigram[ord("e") + 3]) > float(tables.unigram[ord("~") + 3])


def test_lenience_beside_variants_is_refused():
    with pytest.raises(JobError, match="LENIENCE 0.5 applies only without VARIANTS"):
        benchmark.validate(_cfg(lenience=0.5))


@pytest.mark.parametrize(
    "overrides, message",
    [({"top_p": 0.0}, r"top_p must be in \(0, 1\]"), ({"top_k": -1}, "top_k must be an integer")],
)
def test_sampling_settings_are_refused_before_any_weight_is_read(overrides, message):
    with pytest.raises(JobError, match=f"^sampling: SamplingConfig.{message}"):
        benchmark.validate(_cfg(**overrides))


def test_nan_logits_of_a_variant_name_its_own_draft():
    from speculative.jobs.benchmark import run as bench_run
    from speculative.jobs.benchmark import settings as bench_settings

    cfg = _cfg(variants=(Variant("model"), Variant("pl", draft=ml.DraftSpec("prompt_lookup"))))
    s = bench_settings.resolve(cfg, None)
    error = FloatingPointError("NaN logits in rows [0]")
    error.role, error.program = "draft", ("pl", 3)
    message = str(bench_run.nan_error(s, 2, error))
    assert message.startswith("draft prompt_lookup") and "variant 'pl', gamma 3" in message
    error.program = ("model", 2)
    assert str(bench_run.nan_error(s, 2, error)).startswith("draft RANDOM WEIGHTS")
