"""The EnDe data pipeline: dictionary lines -> sentence pairs -> hashed splits -> SentencePiece."""

import json
import pathlib

import pytest

from speculative import ende_data
from speculative.config import gin_flags
from speculative.errors import JobError
from speculative.recipes.ende import clean as ende_clean
from speculative.recipes.ende import data as ende
from speculative.recipes.ende import sources as ende_sources

ROOT = pathlib.Path(__file__).resolve().parents[1]
LINES = [
    "# Version :: devel",
    "Das ist ein ganz normaler Satz hier. :: This is a perfectly normal sentence.",
    "Haus {n} | Häuser {pl} | Wir haben das Haus gestern gekauft. :: house | houses | We bought the house yesterday.",
    "Zu kurz. :: Too short.",
    "Er hat etw. gesagt, was keiner verstand. :: He said sth. that nobody understood.",
    "ein Satz ohne Großbuchstaben am Anfang. :: A sentence in lower case.",
    "Diese Zeile endet nicht mit einem Punkt :: This line does not end with a full stop",
    "Sie kam (wie immer) viel zu spät nach Hause. :: She came home (as always) far too late.",
]


def test_only_full_sentence_pairs_survive_and_alternatives_pair_up():
    assert [p[:2] for p in ende_sources.dictionary_pairs(LINES)] == [
        ("This is a perfectly normal sentence.", "Das ist ein ganz normaler Satz hier."),
        ("We bought the house yesterday.", "Wir haben das Haus gestern gekauft."),
    ]
    # Each sentence is its own document: the split stays a hash of the English sentence.
    assert all(p.document == p.english for p in ende_sources.dictionary_pairs(LINES))


def _sample() -> list[ende_sources.Pair]:
    lines = (ROOT / "tests/data/en_de_pairs.tsv").read_text().splitlines()
    return [ende_sources.Pair(*line.split("\t"), line.split("\t")[0]) for line in lines]


def test_splits_are_a_function_of_the_sentence(tmp_path):
    pairs = _sample()
    counts = ende.write_splits(pairs + pairs[:5], tmp_path)  # duplicates are dropped
    assert sum(counts.values()) == len(pairs) and counts["train"] > 30
    reversed_dir = tmp_path / "reversed"
    ende.write_splits(pairs[::-1], reversed_dir)
    for split in ende.SPLITS:
        a = set((tmp_path / f"{split}.tsv").read_text().splitlines())
        b = set((reversed_dir / f"{split}.tsv").read_text().splitlines())
        assert a == b
    assert {ende_clean.split_of(p[0]) for p in pairs} <= set(ende.SPLITS)


def test_jsonl_splits_hold_the_prefixed_inputs_of_the_tsv(tmp_path):
    ende.write_splits(_sample(), tmp_path)
    for split in ende.SPLITS:
        tsv = [line.split("\t") for line in (tmp_path / f"{split}.tsv").read_text().splitlines()]
        rows = [json.loads(x) for x in (tmp_path / f"{split}.jsonl").read_text().splitlines()]
        assert [(r["inputs"], r["targets"]) for r in rows] == [
            ("translate English to German: " + en, de) for en, de in tsv
        ]


def _predictions(run: pathlib.Path, rows: list[dict], finished: bool = True) -> pathlib.Path:
    run.mkdir()
    (run / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if finished:
        (run / "summary.json").write_text("{}")
    return run


def test_distillation_pairs_are_the_targets_translations(tmp_path):
    prefix = "translate English to German: "
    greedy = _predictions(
        tmp_path / "t0",
        [
            {"index": 0, "inputs": prefix + "A cat.", "output": "Eine Katze."},
            {"index": 1, "inputs": prefix + "A dog.", "output": "Ein\tHund.\n"},
        ],
    )
    sampled = _predictions(
        tmp_path / "t1",
        [
            {"index": 0, "inputs": prefix + "A cat.", "output": " Katze."},
            # a sample that drew EOS first: a real output, but no sentence to train on
            {"index": 1, "inputs": prefix + "A dog.", "output": " "},
        ],
    )
    out = tmp_path / "distill.tsv"
    assert ende_data.main(["--labels_from", str(greedy), str(sampled), "--labels_out", str(out)])
    assert out.read_text().splitlines() == [
        "A cat.\tEine Katze.",
        "A dog.\tEin Hund.",  # a tab or newline in an output would break the TSV
        "A cat.\tKatze.",
    ]
    bad = _predictions(tmp_path / "bad", [{"index": 0, "inputs": "A cat.", "output": "Katze."}])
    with pytest.raises(JobError, match="predictions.jsonl:1: not a translation"):
        ende.distillation_pairs([bad])


@pytest.mark.parametrize(
    "rows, finished, twice, message",
    [
        ([{"inputs": "translate English to German: A.", "output": "B."}], False, False,
         "not a finished infer run"),
        ([{"inputs": "translate English to German: A.", "output": "B."}], True, True,
         "the same infer run is given twice"),
        ([{"inputs": "translate English to German: A.", "output": "B.", "exact": False,
           "lenience": 0.5}], True, False, r"predictions.jsonl:1: decoded lossily \(lenience 0.5\)"),
        (["torn"], True, False, "predictions.jsonl:1: not a predictions row"),
        ([], True, False, "no predictions in"),
    ],
)  # fmt: skip
def test_labels_that_would_be_wrong_are_one_line_errors(tmp_path, rows, finished, twice, message):
    run = _predictions(tmp_path / "run", rows, finished)
    if rows == ["torn"]:
        (run / "predictions.jsonl").write_text('{"inputs": "transl')
    out = tmp_path / "distill.tsv"
    argv = ["--labels_from", str(run), *([str(tmp_path / "run/")] if twice else [])]
    assert gin_flags.run_job(ende_data.main, [*argv, "--labels_out", str(out)]) == 2
    with pytest.raises(JobError, match=message) as e:
        ende_data.main([*argv, "--labels_out", str(out)])
    assert "\n" not in str(e.value) and not out.exists()


def test_missing_package_tools_are_one_line_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no apt-get here
    with pytest.raises(
        JobError, match="^package trans-de-en: apt-get is not installed: .* --dictionary="
    ):
        ende.fetch_package("trans-de-en", tmp_path / "download")
    with pytest.raises(JobError, match="^dictionary .*nope.tsv: cannot read it"):
        ende_data.main(["--dictionary", str(tmp_path / "nope.tsv"), "--out", str(tmp_path / "o"),
                        "--sources", "trans-de-en"])  # fmt: skip


def test_sentencepiece_is_t5_style(tmp_path):
    sentencepiece = pytest.importorskip("sentencepiece")
    model = ende.train_sentencepiece(ROOT / "tests/data/en_de_pairs.tsv", tmp_path / "spm", 200)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model))
    assert (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) == (0, 1, 2, -1)
    ids = sp.encode("Wir haben das Haus gekauft.")
    assert sp.decode(ids) == "Wir haben das Haus gekauft." and min(ids) > 2


def test_a_second_process_building_the_same_directory_is_refused(tmp_path):
    from speculative.outputs import job_io

    with job_io.lock_output_dir(tmp_path / "o"):
        with pytest.raises(JobError, match="is in use by another job"):
            ende_data.main(["--dictionary", str(tmp_path / "d"), "--out", str(tmp_path / "o")])
