"""Fits the unigram / bigram draft tables (configs/drafts/{unigram,bigram}.gin) on a corpus.

  python -m speculative.fit_ngram --vocab_kind=gguf --vocab_path=qwen2.5-coder-1.5b \
      --input_file=corpus.jsonl --input_field=inputs --out=tables.npz [--vocab_size=N]

Each example's input text (and its targets, when the file has them) is tokenised with the jobs'
vocabulary loading (`speculative.VocabSpec`) and counted by `drafts.ngram.fit`; `ngram.save`
writes the .npz that `NGRAM_TABLES` names. vocab_size must be the target's output width as the
job sees it (default: the vocabulary's size; a model table padded past the tokenizer keeps its
padded width, e.g. 264 for configs/demo/tiny_random_models.gin). Fitting on the target's own
samples: pass the predictions.jsonl of an infer run with --input_field=output (then only that
field is counted, not the file's reference 'targets', unless --count=both). --count=targets
counts the targets alone: for a translation target (configs/repro), whose decoder only ever
emits the target language, the source side would blur the tables.
--input_file=python_stdlib counts this interpreter's standard library sources instead
(`drafts.shortlist.python_sources`, the first --stdlib_bytes of text), e.g. for code targets:

  python -m speculative.fit_ngram --vocab_kind=gguf --vocab_path=qwen2.5-coder-1.5b \
      --input_file=python_stdlib --vocab_size=151936 --out=~/.cache/speculative/qwen_stdlib_ngram.npz
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from speculative import vocab
from speculative.config import gin_flags
from speculative.data import inputs
from speculative.drafts import ngram, shortlist
from speculative.errors import JobError
from speculative.loading import specs as ml
from speculative.outputs import logs

log = logging.getLogger(__name__)

STDLIB = "python_stdlib"  # --input_file naming the standard library's .py sources
COUNT_CHOICES = ("auto", "both", "inputs", "targets")


def token_sequences(
    vocabulary: vocab.Vocabulary,
    input_file: str,
    input_field: str,
    limit: int | None = None,
    stdlib_bytes: int = 8 << 20,
    count: str = "auto",
) -> list[list[int]]:
    """Token ids of every example's input and/or target text (count: "both", "inputs",
    "targets" or "auto", see `resolve_count`), one sequence per text; for input_file STDLIB, of each standard library source
    file (up to stdlib_bytes of text)."""
    if count not in COUNT_CHOICES:
        raise JobError(f"count must be one of {COUNT_CHOICES}, got {count!r}")
    count = resolve_count(count, input_field)
    if input_file == STDLIB:
        texts = shortlist.python_sources(stdlib_bytes)[:limit]
        return [list(vocabulary.encode(t)) for t in texts]
    examples = inputs.read_examples(input_file, input_field=input_field, limit=limit)
    sides = {"both": ("inputs", "targets"), "inputs": ("inputs",), "targets": ("targets",)}
    texts = [t for ex in examples for t in (getattr(ex, side) for side in sides[count]) if t]
    return [list(vocabulary.encode(t)) for t in texts]


def resolve_count(count: str, input_field: str) -> str:
    """'auto': both sides of a corpus read by its 'inputs' field; only the named field of any
    other (a predictions file read by 'output' must not count its reference 'targets')."""
    if count != "auto":
        return count
    if input_field == "inputs":
        return "both"
    log.info(f"counting the {input_field!r} field only (--count=both adds the 'targets' column)")
    return "inputs"


def fit_file(
    vocab_spec: ml.VocabSpec,
    input_file: str,
    out: str,
    input_field: str = "inputs",
    vocab_size: int | None = None,
    limit: int | None = None,
    stdlib_bytes: int = 8 << 20,
    count: str = "auto",
) -> ngram.NgramTables:
    """Tokenises `input_file` with `vocab_spec`, fits the tables and writes them to `out`
    (`~` expanded, its folder made)."""
    vocabulary = ml.load_vocabulary(vocab_spec, "vocabulary")
    width = vocab_size if vocab_size is not None else vocab.used_size(vocabulary)
    sequences = token_sequences(vocabulary, input_file, input_field, limit, stdlib_bytes, count)
    if not sequences:
        raise JobError(f"no text to count in {input_file}")
    if max(max(s, default=0) for s in sequences) >= width:
        raise JobError(f"vocab_size {width} is smaller than the tokenizer's ids")
    tables = ngram.fit(sequences, width)
    out = os.path.expanduser(out)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    ngram.save(tables, out)
    tokens = sum(len(s) for s in sequences)
    log.info(f"fitted {len(sequences)} texts, {tokens} tokens, vocab size {width}: wrote {out}")
    return tables


def main(argv: Sequence[str] | None = None) -> int:
    """The command: 0, or 2 after a one-line `error: ...` (`--debug`: the traceback)."""
    return gin_flags.run_job(_main, argv)


def _main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab_kind", required=True, choices=ml.VOCAB_KINDS)
    parser.add_argument("--vocab_path", default=None)
    parser.add_argument("--extra_ids", type=int, default=0)
    parser.add_argument("--input_file", required=True, help=f"a file, or {STDLIB!r}")
    parser.add_argument("--input_field", default="inputs")
    parser.add_argument("--num_examples", type=int, default=None)
    parser.add_argument("--vocab_size", type=int, default=None)
    parser.add_argument("--stdlib_bytes", type=int, default=8 << 20)
    parser.add_argument(
        "--count",
        choices=COUNT_CHOICES,
        default="auto",
        help="texts counted: auto = inputs and targets of a corpus read by 'inputs', else the "
        "--input_field alone (a predictions file's reference column is not counted)",
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--debug", action="store_true", help="a traceback instead of one line")
    args = parser.parse_args(argv)
    logs.setup()
    spec = ml.VocabSpec(args.vocab_kind, args.vocab_path, args.extra_ids)
    fit_file(
        spec, args.input_file, args.out, args.input_field, args.vocab_size, args.num_examples,
        args.stdlib_bytes, args.count,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
