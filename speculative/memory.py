"""Memory report of the paper's configs: T5 v1.1 XXL with small / base / large drafts, per device;
and of a GGUF target with a draft of another tokenizer (drafts/cross_vocab.py).

    python -m speculative.memory [--batch_size 1] [--input_len 512] [--max_decode_len 128] [--gamma 7]
    python -m speculative.memory --target qwen2.5-coder-1.5b --cross_draft smollm2-135m

The arithmetic is `speculative.measure.memory` (and `jobs.common.cross_draft_bytes` for the draft
with its own tokenizer, whose cache is sized by the same `state_bytes` at its own length:
`CrossVocabDrafter.cache_length`); this module is its command line.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import jax.numpy as jnp

from speculative.config import gin_flags
from speculative.drafts.cross_vocab import CrossVocabDrafter
from speculative.errors import JobError
from speculative.jobs.common import cross_draft_bytes
from speculative.measure.memory import GIB, format_table, paper_report, param_bytes, state_bytes
from speculative.outputs import logs
from speculative.parallel import partitioning


def gguf_cross_pair(target: str, draft: str, dtype: Any = jnp.bfloat16) -> tuple[Any, Any]:
    """(target model, CrossVocabDrafter) of two GGUF files (registry names or paths) from their
    metadata and tokenizers alone: no weights are read, the tables are built (seconds)."""
    from speculative import vocab
    from speculative.checkpoints import families, gguf
    from speculative.checkpoints.gguf_io import open_gguf
    from speculative.loading import fetch
    from speculative.vocab.cross_tables import build_tables

    models, vocabularies = [], []
    for name in (target, draft):
        path = name if name.endswith(".gguf") else str(fetch.ensure_model(name))
        reader = open_gguf(path)
        tensors = {t.name: t for t in reader.tensors}
        models.append(families.build(gguf.config_from_metadata(reader, tensors, dtype)))
        vocabularies.append(vocab.from_gguf(path))
    (target_model, draft_model), (target_vocab, draft_vocab) = models, vocabularies
    tables = build_tables(
        draft_vocab, target_vocab, draft_model.vocab_size, target_model.vocab_size
    )
    drafter = CrossVocabDrafter(
        draft_model, target_model.vocab_size, tables.width, tables.draft_eos,
        spelling_lengths=tables.spelling_lengths,
    )  # fmt: skip
    return target_model, drafter


def cross_report(a: argparse.Namespace) -> str:
    """One table row (GiB on one device) of --target with the --cross_draft of another tokenizer."""
    target, drafter = gguf_cross_pair(a.target, a.cross_draft)
    mesh = {"data": 1, "model": 1}
    args = (a.batch_size, a.input_len, a.max_decode_len, a.gamma)
    rules = partitioning.TARGET_RULES
    parts = {
        "target params": param_bytes(target, rules, mesh, jnp.bfloat16),
        "target cache": state_bytes(target, rules, mesh, *args),
        **cross_draft_bytes(drafter, mesh, *args, jnp.bfloat16),
    }
    per_token = f"cache sized for up to {drafter.width} draft tokens per target token"
    row = {"target": a.target, "draft": f"{a.cross_draft} (K = {drafter.width}, {per_token})"}
    row.update({k: round(v / GIB, 3) for k, v in parts.items()})
    row["total"] = round(sum(parts.values()) / GIB, 3)
    return format_table([row])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="memory report of the paper's T5 configs")
    parser.add_argument("--batch_size", type=int, default=1)
    parser.add_argument("--input_len", type=int, default=512)
    parser.add_argument("--max_decode_len", type=int, default=128)
    parser.add_argument("--gamma", type=int, default=7)
    parser.add_argument(
        "--cross_draft",
        default=None,
        help="a GGUF draft of another tokenizer (registry name or path): report it with --target "
        "instead of the T5 configs",
    )
    parser.add_argument("--target", default="qwen2.5-coder-1.5b", help="with --cross_draft")
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
    if a.cross_draft is not None:
        print(cross_report(a))
        return
    print(format_table(paper_report(a.batch_size, a.input_len, a.max_decode_len, a.gamma)))


if __name__ == "__main__":
    sys.exit(gin_flags.run_job(main))
