"""English->German sentence pairs for the EnDe reproduction in miniature, and their vocabulary.

Sources (speculative/recipes/ende/sources.py; `--sources`, default all): the Debian packages of the Ding
dictionary (`trans-de-en`, full-sentence entries only, GPL-2+), the LibreOffice help
(`libreoffice-help-en-us` + `libreoffice-help-de`, MPL-2.0, aligned by page and paragraph id), the
GIMP help (`gimp-help-en` + `gimp-help-de`, GFDL-1.2+, aligned by page and paragraph position) and
LibreOffice's UI messages (`libreoffice-l10n-de`, MPL-2.0, the entries that are sentences). They
are fetched with `apt-get download` and unpacked with `dpkg-deb` at run time, into a temporary
directory that goes when the build ends; nothing of them is committed. `--sources trans-de-en`
rebuilds the dictionary-only corpus of before byte for byte.

Cleaning (speculative/recipes/ende/clean.py): long paragraphs cut into sentences where both sides agree,
untranslated, too short, too long and badly proportioned pairs dropped (the dictionary keeps its
own rules), every English sentence kept once, at its first occurrence (sources in the order
above). Splits are a function of a pair's document (a hash: 90% train, 5% validation, 5% test), so
a help page never sits in two splits; a dictionary sentence is its own document, as before.

Each split is written twice: `{split}.tsv` (english<TAB>german, what the trainer and the seqio Task
read) and `{split}.jsonl` ({"inputs": T5's prefix + english, "targets": german}, what the benchmark
job and fit_ngram read). `corpus.json` records per source its packages' versions, license, pairs
and words per split and what each filter dropped. The SentencePiece vocabulary is trained on the
training split alone, T5-style: pad 0, EOS 1, unk 2, no BOS (`--vocab_size 0`: none).

    python -m speculative.ende_data --out data/ende --vocab_size 4000   (speculative/ende_data.py)

Sequence-level distillation labels (DistillSpec): the target's own translations of the training
inputs, from `speculative.infer` runs over the Task's train split, as a training TSV:

    python -m speculative.ende_data --labels_from runs/ende/labels_t0 runs/ende/labels_t1 \
        --labels_out data/ende/train_distill.tsv
"""

from __future__ import annotations

import json
import logging
import pathlib
import subprocess
import tempfile
import urllib.parse
from collections.abc import Callable, Sequence

from speculative.errors import JobError
from speculative.outputs import job_io
from speculative.recipes.ende import clean as ende_clean
from speculative.recipes.ende.sources import DICTIONARY, SOURCES, Pair

log = logging.getLogger(__name__)

SPLITS = ende_clean.SPLITS
TASK_PREFIX = "translate English to German: "
# fetch(package, workdir) -> (the unpacked package's root, its version)
Fetch = Callable[[str, pathlib.Path], tuple[pathlib.Path, str]]


def write_splits(pairs: Sequence[Pair | tuple[str, str]], out: pathlib.Path) -> dict[str, int]:
    """out/{train,validation,test}.tsv (english<TAB>german) and .jsonl, each pair in its
    document's split, each English sentence once (its first pair). A bare (english, german) is
    its own document, as a dictionary sentence is."""
    out.mkdir(parents=True, exist_ok=True)
    pairs = [p if isinstance(p, Pair) else Pair(p[0], p[1], p[0]) for p in pairs]
    rows = ende_clean.by_split(ende_clean.dedup(pairs, set())[0])
    for split, split_pairs in rows.items():
        lines = "".join(f"{p.english}\t{p.german}\n" for p in split_pairs)
        job_io.write_text_atomic(out / f"{split}.tsv", lines)
        records = [
            json.dumps({"inputs": TASK_PREFIX + p.english, "targets": p.german}, ensure_ascii=False)
            for p in split_pairs
        ]
        job_io.write_text_atomic(out / f"{split}.jsonl", "".join(r + "\n" for r in records))
    return {split: len(split_pairs) for split, split_pairs in rows.items()}


def collect(names: Sequence[str], fetch: Fetch, workdir: pathlib.Path) -> tuple[list[Pair], dict]:
    """The cleaned pairs of the named sources, in SOURCES order, and corpus.json's entry per
    source. fetch(package, workdir) -> (unpacked root, version); a failure is its JobError."""
    seen: set[str] = set()
    kept_all: list[Pair] = []
    manifest = {}
    for name in [name for name in SOURCES if name in names]:
        source = SOURCES[name]
        roots, versions = {}, {}
        for package in source.packages:
            roots[package], versions[package] = fetch(package, workdir)
        extracted = source.read(roots)
        if source.own_rules:
            kept, duplicates = ende_clean.dedup(extracted, seen)
            dropped = {"duplicate": duplicates} if duplicates else {}
        else:
            kept, dropped = ende_clean.clean(extracted, seen)
        manifest[name] = {
            "packages": versions,
            "license": source.license,
            "aligned_by": source.aligned_by,
            "extracted_pairs": len(extracted),
            "dropped": dict(sorted(dropped.items())),
            **ende_clean.counts(ende_clean.by_split(kept)),
        }
        kept_all += kept
        log.info(f"{name}: {len(extracted)} pairs extracted, {len(kept)} kept")
    return kept_all, manifest


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
    pairs, empty = [], 0
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
            if not source.startswith(TASK_PREFIX):
                raise JobError("not a translation of a prefixed input", role="labels", path=where)
            if not output:  # a sample that ends at once: no sentence to train on
                empty += 1
                continue
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
    if empty:
        log.info(f"{path}: {empty} empty translation(s) left out")
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


def fetch_package(package: str, workdir: pathlib.Path) -> tuple[pathlib.Path, str]:
    """Downloads and unpacks a Debian package into workdir/package; returns (that root, the
    package's version). Raises JobError naming the package when the system's package tools are
    missing or fail."""
    workdir = workdir.resolve()  # the tools run inside it: a relative --out must not be re-rooted
    debs = workdir / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    _system(["apt-get", "download", package], debs, package)
    found = sorted(debs.glob(f"{package}_*.deb"))
    if not found:
        raise JobError(f"apt-get download left no {package}_*.deb", role="package", path=package)
    _system(["dpkg-deb", "-x", str(found[-1]), str(workdir / package)], workdir, package)
    return workdir / package, urllib.parse.unquote(found[-1].name.split("_")[1])


def given_dictionary(path: pathlib.Path, fetch: Fetch) -> Fetch:
    """fetch, except that trans-de-en is the given unpacked de-en file (`--dictionary`)."""

    def fetch_or_given(package: str, workdir: pathlib.Path) -> tuple[pathlib.Path, str]:
        if package != "trans-de-en":
            return fetch(package, workdir)
        if not path.is_file():
            raise JobError("cannot read it: no such file", role="dictionary", path=path)
        root = workdir / "given-trans-de-en"
        (root / DICTIONARY).parent.mkdir(parents=True, exist_ok=True)
        (root / DICTIONARY).symlink_to(path.resolve())
        return root, f"given: {path}"

    return fetch_or_given


def _system(command: list[str], cwd: pathlib.Path, package: str) -> None:
    """Runs one of the system's package tools; a missing or failing one is a JobError."""
    try:
        subprocess.run(command, cwd=cwd, check=True, stdout=subprocess.DEVNULL)
    except FileNotFoundError:
        raise JobError(
            f"{command[0]} is not installed: the corpus comes from Debian packages; elsewhere "
            "pass --sources=trans-de-en --dictionary=<the unpacked de-en file of trans-de-en>",
            role="package",
            path=package,
        ) from None
    except subprocess.CalledProcessError as e:
        raise JobError(
            f"{' '.join(command)} failed (exit {e.returncode})", role="package", path=package
        ) from None


def write_distillation(prediction_dirs: Sequence[pathlib.Path], labels_out: pathlib.Path) -> int:
    """`distillation_pairs` of infer runs written as one training TSV; returns the pair count."""
    pairs = distillation_pairs(prediction_dirs)
    lines = "".join(f"{english}\t{german}\n" for english, german in pairs)
    job_io.write_text_atomic(labels_out, lines)
    log.info(f"{len(pairs)} distillation pairs in {labels_out}")
    return len(pairs)


def build(names: Sequence[str], out_dir: str, fetch: Fetch, vocab_size: int) -> dict[str, int]:
    """The corpus of `names` (keys of SOURCES) in out_dir: splits, corpus.json and, unless
    vocab_size is 0, the SentencePiece vocabulary; returns the pair count of each split."""
    # Every run rebuilds the whole directory from its sources (nothing resumes, so nothing of two
    # configurations can mix); the lock keeps a second process from writing it at the same time.
    # Every package is fetched and read before the first file is written.
    with job_io.lock_output_dir(out_dir) as out:
        with tempfile.TemporaryDirectory(dir=out, prefix=".packages-") as workdir:
            pairs, manifest = collect(names, fetch, pathlib.Path(workdir))
        counts = write_splits(pairs, out)
        corpus = {"splits": counts, "filters": ende_clean.FILTERS, "sources": manifest}
        if vocab_size:
            model = train_sentencepiece(out / "train.tsv", out / "spm", vocab_size)
            corpus["vocabulary"] = {"model": model.name, "vocab_size": vocab_size}
        job_io.write_text_atomic(out / "corpus.json", json.dumps(corpus, indent=1) + "\n")
    log.info(f"{counts} pairs in {out}")
    return counts
