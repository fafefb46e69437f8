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
import pathlib
import re
import subprocess
import tempfile
from collections.abc import Iterable, Sequence

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
        (out / f"{split}.tsv").write_text("".join(lines), encoding="utf-8")
        with open(out / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for line in lines:
                english, german = line.rstrip("\n").split("\t")
                record = {"inputs": TASK_PREFIX + english, "targets": german}
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return {split: len(lines) for split, lines in rows.items()}


def distillation_pairs(prediction_dirs: Sequence[pathlib.Path]) -> list[tuple[str, str]]:
    """(english, the target's translation) of every row of each infer run's predictions.jsonl,
    in order; the runs decoded the Task's inputs, so T5's prefix is stripped again. A row whose
    input lacks the prefix, or an empty output, is an error (the labels would be wrong)."""
    pairs = []
    for run in prediction_dirs:
        path = pathlib.Path(run) / "predictions.jsonl"
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                row = json.loads(line)
                source, output = row["inputs"], row["output"].strip()
                if not source.startswith(TASK_PREFIX) or not output:
                    raise ValueError(f"{path}:{line_no}: not a translation of a prefixed input")
                if "\t" in output or "\n" in output:
                    output = " ".join(output.split())
                pairs.append((source[len(TASK_PREFIX) :], output))
    if not pairs:
        raise ValueError(f"no predictions in {list(map(str, prediction_dirs))}")
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
    """Downloads and unpacks the Debian package; returns the path of its de-en dictionary."""
    workdir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["apt-get", "download", "trans-de-en"], cwd=workdir, check=True)
    (deb,) = sorted(workdir.glob("trans-de-en_*.deb"))
    subprocess.run(["dpkg-deb", "-x", str(deb), str(workdir / "root")], check=True)
    return workdir / "root/usr/share/trans/de-en"


def main(argv: Sequence[str] | None = None) -> dict[str, int]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="data/ende")
    parser.add_argument("--dictionary", help="an unpacked de-en file (default: download it)")
    parser.add_argument("--vocab_size", type=int, default=4000)
    parser.add_argument("--labels_from", nargs="+", type=pathlib.Path, help="infer OUTPUT_DIRs")
    parser.add_argument("--labels_out", type=pathlib.Path, help="the distillation TSV to write")
    args = parser.parse_args(argv)
    if args.labels_from:
        if not args.labels_out:
            parser.error("--labels_from needs --labels_out")
        pairs = distillation_pairs(args.labels_from)
        lines = "".join(f"{english}\t{german}\n" for english, german in pairs)
        args.labels_out.write_text(lines, encoding="utf-8")
        print(f"{len(pairs)} distillation pairs in {args.labels_out}")
        return {"distill": len(pairs)}
    out = pathlib.Path(args.out)
    source = (
        pathlib.Path(args.dictionary) if args.dictionary else fetch_dictionary(out / "download")
    )
    with open(source, encoding="utf-8") as f:
        counts = write_splits(sentence_pairs(f), out)
    model = train_sentencepiece(out / "train.tsv", out / "spm", args.vocab_size)
    print(f"{counts} pairs in {out}; vocabulary {model}")
    return counts


if __name__ == "__main__":
    main()
