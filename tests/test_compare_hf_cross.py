"""scripts/compare_hf.py --cross_draft on tiny GGUF files (random weights, two trained byte-level
BPE tokenizers): our cross-vocabulary program, fed the prompt text in the draft's tokens, and
transformers' universal assisted generation (greedy and sampled, each assistant schedule) run
through the script's own classes, and greedy output equals each side's plain output. Needs the
`[compare]` extra (torch, transformers); slow (about 30 s: two compiled programs and torch). And
the cell summary: the headline stays the same-tokenizer pair, the cross programs summed apart."""

import json
import pathlib
import sys
import types

import pytest

from speculative.decoding.sampling import SamplingConfig
from tests.test_cross_vocab import DRAFT_TEXT, TARGET_TEXT, _trained
from tests.test_cross_vocab_jobs import write_bpe_model

ROOT = pathlib.Path(__file__).resolve().parents[1]
TEXTS = ["def add(a, b):\n    return", "for i in range(10): café"]


@pytest.fixture
def scripts(monkeypatch):
    """(compare_hf, compare_hf_cross), imported from scripts/ as the script imports them."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    for name in ("compare_hf", "compare_hf_cross", "hf_generate"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import compare_hf
    import compare_hf_cross

    return compare_hf, compare_hf_cross


def test_the_cross_programs_are_summed_apart_from_the_headline(scripts):
    compare_hf, compare_hf_cross = scripts
    speeds = {"ours plain": 10, "ours speculative gamma 5": 20, "hf plain": 8, "hf assisted 5": 12}
    cross = {"ours cross-vocabulary d gamma 4": 30, "hf assisted cross d default": 25}
    programs = [(n, "ours" if n.startswith("ours") else "hf float32", None) for n in speeds]
    programs += [(n, "ours" if n.startswith("ours") else "hf float32", None) for n in cross]
    rows = {
        n: {"seconds": [1.0], "tokens": [[1] * t], "target_calls": 1, "beta": 0, "verified": 0}
        for n, t in {**speeds, **cross}.items()
    }
    cell = compare_hf._summarize(1.0, programs, rows, ["float32"])
    assert cell["best_ours_speculative"] == "ours speculative gamma 5"
    assert cell["best_hf_assisted"] == "hf assisted 5"
    cell["cross"] = compare_hf_cross.summary(cell, "tables line")
    assert cell["cross"]["ours_over_hf"] == pytest.approx(30 / 25)
    assert "best ours (ours cross-vocabulary d gamma 4)" in compare_hf._markdown(cell)


def test_a_failing_program_is_a_failed_cell_and_the_others_go_on(scripts):
    """A peer program that raises (transformers' universal assisted generation: RuntimeError
    "cannot reshape tensor of 0 elements") is recorded with its name, exception type and message
    in the cell's JSON and markdown; the other programs are summarised as usual."""
    compare_hf, compare_hf_cross = scripts
    names = ["ours plain", "ours speculative gamma 5", "hf plain", "hf assisted 5"]
    names += ["ours cross-vocabulary d gamma 4", "hf assisted cross d default"]
    rows = {
        n: {"seconds": [], "tokens": [], "target_calls": 0, "beta": 0, "verified": 0} for n in names
    }
    speeds = {n: 10 + i for i, n in enumerate(names)}

    def fail():
        raise RuntimeError("cannot reshape tensor of 0 elements into shape [1, 0, -1, 64]")

    for prompt in ("HumanEval/100", "HumanEval/101"):
        for name in names:
            if "failed" in rows[name]:
                continue
            if name == "hf assisted cross d default":
                compare_hf.record(rows[name], name, prompt, fail)
            else:
                result = ([1] * speeds[name], 1.0, {"target_calls": 1})
                compare_hf.record(rows[name], name, prompt, lambda r=result: r)
    failed = rows["hf assisted cross d default"]["failed"]
    assert failed == {
        "program": "hf assisted cross d default",
        "prompt": "HumanEval/100",
        "error": "RuntimeError",
        "message": "cannot reshape tensor of 0 elements into shape [1, 0, -1, 64]",
    }
    assert rows["hf assisted 5"]["seconds"] == [1.0, 1.0]  # the others went on
    programs = [(n, "ours" if n.startswith("ours") else "hf float32", None) for n in names]
    cell = compare_hf._summarize(0.0, programs, rows, ["float32"])
    assert cell["failed"] == [failed]
    assert cell["programs"]["hf assisted cross d default"] == {
        "side": "hf float32",
        "failed": failed,
    }
    assert cell["greedy_identical_to_own_plain"]["hf assisted cross d default"] is None
    assert cell["best_hf_assisted"] == "hf assisted 5"
    assert cell["ours_over_best_hf_assisted"] == pytest.approx(11 / 13)
    cell["cross"] = compare_hf_cross.summary(cell, "tables line")
    assert cell["cross"]["best_hf"] is None and cell["cross"]["ours_over_hf"] is None
    table = compare_hf._markdown(cell)
    assert (
        "| hf assisted cross d default | failed on HumanEval/100: RuntimeError: cannot reshape "
        "tensor of 0 elements into shape [1, 0, -1, 64] | | | | | |" in table
    )
    assert "best HF universal assisted (None) = n/a" in table
    assert json.loads(json.dumps(cell))["failed"] == [failed]


@pytest.mark.slow
def test_cross_draft_programs_on_both_sides(tmp_path, scripts):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    compare_hf, compare_hf_cross = scripts

    target = write_bpe_model(
        _trained(TARGET_TEXT, 300, "<|endoftext|>"), tmp_path / "target.gguf", 0
    )
    # EOS "<|endoftext|>": transformers' GGUF tokenizer adds a token of that name when it lacks one
    draft = write_bpe_model(_trained(DRAFT_TEXT, 280, "<|endoftext|>"), tmp_path / "draft.gguf", 1)
    args = types.SimpleNamespace(max_new_tokens=10, dtype="float32", draft_shortlists=[0])
    hf = compare_hf.HuggingFace(target, target, args, "float32")
    prompts = [hf.tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    ours = compare_hf.Ours(target, target, 32, args, prompts)  # the target as its own draft
    cross = compare_hf_cross.Cross(str(draft), ours, {"float32": hf}, TEXTS, prompts)
    assert "target tokens spelled in up to" in cross.tables
    programs = cross.programs([3], [2])
    assert [side for _, side, _ in programs] == ["ours", "hf float32", "hf float32"]
    stop = [ours.vocab.eos_id]
    for j, ids in enumerate(prompts):
        plain = {
            "ours": ours.run("ours plain", None, ids, SamplingConfig(), j)[0],
            "hf float32": hf.run(None, ids, SamplingConfig(), stop, j, False)[0],
        }
        for name, side, program in programs:
            for sampling in (SamplingConfig(), SamplingConfig(temperature=1.0)):
                tokens, seconds, stats = cross.run(
                    name, side, program, ids, sampling, stop, j, False
                )
                assert seconds > 0 and stats["target_calls"] >= 1 and tokens
                if sampling.greedy:
                    assert tokens == plain[side], (name, tokens, plain[side])


def test_transformers_models_are_loaded_dense(tmp_path, scripts):
    """compare_hf's transformers side loads a GGUF file as dense weights of the dtype asked
    (GgufConfig(dequantize=True)), never GGUF-packed layers unpacked on every forward, and says
    so in the route the result file records."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import hf_generate  # scripts/, on the path through the `scripts` fixture

    path = write_bpe_model(_trained(TARGET_TEXT, 300, "<|endoftext|>"), tmp_path / "t.gguf", 0)
    for dtype in ("float32", "bfloat16"):
        model = hf_generate.hf_model(path, dtype)
        route = hf_generate.weights_route(model)
        assert route == {
            "load": hf_generate.DENSE,
            "parameter_dtypes": [dtype],
            "packed_modules": [],
        }
