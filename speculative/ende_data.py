"""English->German sentence pairs for the EnDe reproduction in miniature, and their vocabulary.

The corpus, its sources, cleaning, splits and vocabulary are `speculative.recipes.ende` (`data`
builds, `sources` fetches, `clean` filters); this is the command line over `data.build` and
`data.write_distillation`.

    python -m speculative.ende_data --out data/ende --vocab_size 4000
    python -m speculative.ende_data --labels_from runs/ende/labels_t0 runs/ende/labels_t1 \
        --labels_out data/ende/train_distill.tsv
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Sequence

from speculative.config import gin_flags
from speculative.outputs import logs
from speculative.recipes.ende import data
from speculative.recipes.ende.data import SOURCES, Fetch, fetch_package


def main(argv: Sequence[str] | None = None, fetch: Fetch = fetch_package) -> dict[str, int]:
    """The command; a problem the user can fix is a JobError (one line, exit 2, under run_job)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="data/ende")
    parser.add_argument("--sources", default="all", help=f"all, or some of {','.join(SOURCES)}")
    parser.add_argument("--dictionary", help="an unpacked de-en file (default: download it)")
    parser.add_argument("--vocab_size", type=int, default=4000, help="0: no vocabulary")
    parser.add_argument("--labels_from", nargs="+", type=pathlib.Path, help="infer OUTPUT_DIRs")
    parser.add_argument("--labels_out", type=pathlib.Path, help="the distillation TSV to write")
    parser.add_argument("--debug", action="store_true", help="a traceback instead of one line")
    args = parser.parse_args(argv)
    logs.setup()
    if args.labels_from:
        if not args.labels_out:
            parser.error("--labels_from needs --labels_out")
        return {"distill": data.write_distillation(args.labels_from, args.labels_out)}
    names = list(SOURCES) if args.sources == "all" else args.sources.split(",")
    unknown = sorted(set(names) - set(SOURCES))
    if unknown:
        parser.error(f"--sources: unknown {', '.join(unknown)}; known: {', '.join(SOURCES)}")
    if args.dictionary:
        fetch = data.given_dictionary(pathlib.Path(args.dictionary), fetch)
    return data.build(names, args.out, fetch, args.vocab_size)


if __name__ == "__main__":
    sys.exit(gin_flags.run_job(main))
