"""Memory report of the paper's configs: T5 v1.1 XXL with small / base / large drafts, per device.

    python -m speculative.memory [--batch_size 1] [--input_len 512] [--max_decode_len 128] [--gamma 7]

The arithmetic is `speculative.measure.memory`; this module is only its command line.
"""

from __future__ import annotations

import argparse
import sys

from speculative import gin_flags, logs
from speculative.errors import JobError
from speculative.measure.memory import format_table, paper_report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="memory report of the paper's T5 configs")
    parser.add_argument("--batch_size", type=int, default=1)
    parser.add_argument("--input_len", type=int, default=512)
    parser.add_argument("--max_decode_len", type=int, default=128)
    parser.add_argument("--gamma", type=int, default=7)
    parser.add_argument("--debug", action="store_true", help="a traceback instead of one line")
    a = parser.parse_args(argv)
    for name in ("batch_size", "input_len", "max_decode_len", "gamma"):
        if getattr(a, name) < 1:
            raise JobError(f"--{name} must be >= 1, got {getattr(a, name)}")
    logs.setup()  # the table is the output (stdout); anything logged goes to stderr
    print(
        f"GiB per device, bf16 params, batch {a.batch_size}, input {a.input_len}, "
        f"decode {a.max_decode_len}, gamma {a.gamma}"
    )
    print(format_table(paper_report(a.batch_size, a.input_len, a.max_decode_len, a.gamma)))


if __name__ == "__main__":
    sys.exit(gin_flags.run_job(main))
