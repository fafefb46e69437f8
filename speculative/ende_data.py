"""English->German sentence pairs for the EnDe reproduction in miniature, and their vocabulary.

Source: the Debian package `trans-de-en` (the Ding project's German-English dictionary, GPL-2+),
fetched with `apt-get download` and unpacked with `dpkg-deb`; nothing of it is committed beyond
the 40-pair test sample. Its lines read `german :: english`, with parallel alternatives separated
by `|` (and synonyms by `;`). Of every alternative we keep the pairs whose two sides are single
full sentences, by the rules tests/data/README.md gives for the sample: capitalised, ending in a
full stop, 25-80 characters on the German side, and free of the dictionary's markup
(`/ ( ) { } [ ] ; |`) and abbreviations (`jd. etw. sb. sth.`). trans-de-en 1.9-6 yields 10,658.

Splits are a pure function of the English sentence (a hash: 90% train, 5% validation, 5% test), so
they do not depend on file order or version. Each split is written twice: `{split}.tsv`
(english<TAB>german, what the trainer and the seqio Task read) and `{split}.jsonl` ({"inputs":
T5's prefix + english, "targets": german}, what the benchmark job and fit_ngram read). The
SentencePiece vocabulary is trained on the training split alone, T5-style: pad 0, EOS 1, unk 2,
no BOS.

    python -m speculative.ende_data --out data/ende --vocab_size 4000

Sequence-level distillation labels (DistillSpec): the target's own translations of the training
inputs, from `speculative.infer` runs over the Task's train split, as a training TSV:

    python -m speculative.ende_data --labels_from runs/ende/labels_t0 runs/ende/labels_t1 \
        --labels_out data/ende/train_distill.tsv
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import pathlib
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence

from speculative import gin_flags, job_io, logs
from speculative.errors import JobError

log = logging.getLogger(__name__)

MARKUP = re.compile(r"[/(){}\[\];|]|\b(jd|etw|sb|sth)\.")
SPLITS = ("train", "validation", "test")
TASK_PREFIX = "translate English to German: "


def is_sentence(text: str) -> bool:
    return bool(text) and text[0].isupper() and text.endswith(".") and not MARKUP.search(text)


def sentence_pairs(lines: Iterable[str]) -> list[tuple[str, str]]:
    """(english, german) of every dictionary line whose sides are single full sentences."""
    pairs = []
    for line in lines:
        if line.startswith("#") or " :: " not in line:
            continue
        german, english = line.rstrip("\n").split(" :: ", 1)
        # A line holds parallel alternatives separated by "|" (e.g. singular | plural).
        for de, en in zip(german.split("|"), english.split("|")):
            de, en = de.strip(), en.strip()
            if 25 <= len(de) <= 80 and is_sentence(de) and is_sentence(en):
                pairs.append((en, de))
    return pairs


def split_of(english: str) -> str:
    """'train' (90%), 'validation' (5%) or 'test' (5%), by a hash of the English side."""
    bucket = int(hashlib.sha256(english.encode("utf-8")).hexdigest(), 16) % 100
    return "train" if bucket < 90 else "validation" if bucket < 95 else "test"


def write_splits(pairs: Sequence[tuple[str, str]], out: pathlib.Path) -> dict[str, int]:
    """out/{train,validation,test}.tsv (english<TAB>german, deduplicated on the English side)."""
    out.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    rows: dict[str, list[str]] = {split: [] for split in SPLITS}
    for english, german in pairs:
        if english not in seen:
            seen.add(english)
            rows[split_of(english)].append(f"{english}\t{german}\n")
    for split, lines in rows.items():
        job_io.write_text_atomic(out / f"{split}.tsv", "".join(lines))
        records = []
        for line in lines:
            english, german = line.rstrip("\n").split("\t")
            record = {"inputs": TASK_PREFIX + english, "targets": german}
            records.append(json.dumps(record, ensure_ascii=False) + "\n")
        job_io.write_text_atomic(out / f"{split}.jsonl", "".join(records))
    return {split: len(lines) for split, lines in rows.items()}


def distillation_pairs(prediction_dirs: Sequence[pathlib.Path]) -> list[tuple[str, str]]:
    """(english, the target's translation) of every row of each infer run's predictions.jsonl,
    in order; the runs decoded the Task's inputs, so T5's prefix is stripped again.

    Raises JobError naming the run (and line) for labels that would be wrong: the same run given
    twice, a run that has not finished (no summary.json), a row that is not JSON, lacks its
    prefix or output, or was decoded lossily (lenience < 1: not the target's own translation)."""
    runs = [pathlib.Path(run) for run in prediction_dirs]
    resolved = [run.resolve() for run in runs]
    for i, run in enumerate(resolved):
        if run in resolved[:i]:
            raise JobError("the same infer run is given twice", role="labels", path=runs[i])
    pairs = []
    for run in runs:
        if not (run / "summary.json").is_file():
            raise JobError(
                "not a finished infer run (no summary.json): let it finish, or rerun it",
                role="labels",
                path=run,
            )
        pairs += _run_pairs(run / "predictions.jsonl")
    if not pairs:
        raise JobError(f"no predictions in {', '.join(map(str, runs))}", role="labels")
    return pairs


def _run_pairs(path: pathlib.Path) -> list[tuple[str, str]]:
    pairs = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            where = f"{path}:{line_no}"
            try:
                row = json.loads(line)
                source, output = row["inputs"], row["output"].strip()
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise JobError(
                    f"not a predictions row ({e!r})", role="labels", path=where
                ) from None
            if not source.startswith(TASK_PREFIX) or not output:
                raise JobError("not a translation of a prefixed input", role="labels", path=where)
            if row.get("exact") is False:
                raise JobError(
                    f"decoded lossily (lenience {row.get('lenience')}): not the target's own "
                    "translation",
                    role="labels",
                    path=where,
                )
            if "\t" in output or "\n" in output:
                output = " ".join(output.split())
            pairs.append((source[len(TASK_PREFIX) :], output))
    return pairs


def train_sentencepiece(
    train_tsv: pathlib.Path, prefix: pathlib.Path, vocab_size: int
) -> pathlib.Path:
    """A unigram SentencePiece model over both sides of the training split as the model reads them
    (inputs with T5's task prefix), pad 0, EOS 1, unk 2."""
    import sentencepiece as spm

    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8", delete=False) as text:
        for line in train_tsv.read_text(encoding="utf-8").splitlines():
            english, german = line.split("\t", 1)
            text.write(f"{TASK_PREFIX}{english}\n{german}\n")
    spm.SentencePieceTrainer.train(
        input=text.name, model_prefix=str(prefix), vocab_size=vocab_size, model_type="unigram",
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, character_coverage=1.0,
        hard_vocab_limit=False,
    )  # fmt: skip
    pathlib.Path(text.name).unlink()
    return prefix.with_suffix(".model")


def fetch_dictionary(workdir: pathlib.Path) -> pathlib.Path:
    """Downloads and unpacks the Debian package; returns the path of its de-en dictionary.
    Raises JobError when the system's package tools are missing or fail."""
    workdir.mkdir(parents=True, exist_ok=True)
    _system(["apt-get", "download", "trans-de-en"], workdir)
    debs = sorted(workdir.glob("trans-de-en_*.deb"))
    if not debs:
        raise JobError(
            f"apt-get download left no trans-de-en_*.deb in {workdir}", role="dictionary"
        )
    _system(["dpkg-deb", "-x", str(debs[-1]), str(workdir / "root")], workdir)
    return workdir / "root/usr/share/trans/de-en"


def _system(command: list[str], cwd: pathlib.Path) -> None:
    """Runs one of the system's package tools; a missing or failing one is a JobError."""
    try:
        subprocess.run(command, cwd=cwd, check=True)
    except FileNotFoundError:
        raise JobError(
            f"{command[0]} is not installed: the corpus comes from the Debian package "
            "trans-de-en; elsewhere pass --dictionary=<its unpacked de-en file>",
            role="dictionary",
        ) from None
    except subprocess.CalledProcessError as e:
        raise JobError(
            f"{' '.join(command)} failed (exit {e.returncode})", role="dictionary"
        ) from None


def main(argv: Sequence[str] | None = None) -> dict[str, int]:
    """The command; a problem the user can fix is a JobError (one line, exit 2, under run_job)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="data/ende")
    parser.add_argument("--dictionary", help="an unpacked de-en file (default: download it)")
    parser.add_argument("--vocab_size", type=int, default=4000)
    parser.add_argument("--labels_from", nargs="+", type=pathlib.Path, help="infer OUTPUT_DIRs")
    parser.add_argument("--labels_out", type=pathlib.Path, help="the distillation TSV to write")
    parser.add_argument("--debug", action="store_true", help="a traceback instead of one line")
    args = parser.parse_args(argv)
    logs.setup()
    if args.labels_from:
        if not args.labels_out:
            parser.error("--labels_from needs --labels_out")
        pairs = distillation_pairs(args.labels_from)
        lines = "".join(f"{english}\t{german}\n" for english, german in pairs)
        job_io.write_text_atomic(args.labels_out, lines)
        log.info(f"{len(pairs)} distillation pairs in {args.labels_out}")
        return {"distill": len(pairs)}
    # Every run rebuilds the whole directory from its source (nothing resumes, so nothing of two
    # configurations can mix); the lock keeps a second process from writing it at the same time.
    with job_io.lock_output_dir(args.out) as out:
        source = (
            pathlib.Path(args.dictionary) if args.dictionary else fetch_dictionary(out / "download")
        )
        try:
            with open(source, encoding="utf-8") as f:
                pairs = sentence_pairs(f)
        except (OSError, UnicodeDecodeError) as e:
            raise JobError(f"cannot read it: {e}", role="dictionary", path=source) from None
        counts = write_splits(pairs, out)
        model = train_sentencepiece(out / "train.tsv", out / "spm", args.vocab_size)
    log.info(f"{counts} pairs in {out}; vocabulary {model}")
    return counts


if __name__ == "__main__":
    sys.exit(gin_flags.run_job(main))
