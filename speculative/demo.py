"""Main job: speculative vs plain decoding of real pretrained weights on HumanEval prompts.

Default: Qwen2.5-Coder-1.5B-Instruct (target) with Qwen2.5-Coder-0.5B-Instruct (draft), both GGUF
weights fetched once from the package registry and dequantised straight into the dtype `--dtype
auto` picks (bfloat16 through the CPU's matrix units where it has them, else float32;
docs/design.md §9), greedy, 128 tokens, gamma 8, the draft's output head cut to a 32,768-id
shortlist (exact; `drafts/shortlist.py`), its weights in int8 where the CPU has int8 dot units
(`--draft_quantize auto`; exact; `models/int8.py`) and its tokens staged by prompt lookup, 3 a
draft call (exact; `drafts/staged.py`): the best configuration measured on the 20-prompt table
(docs/benchmarks.md, "Prefill orientation"). Plain decoding runs in the same dtype, the fastest
plain decoding here. Prints the completions, alpha, tau, measured c, tokens/s of both decoders (each
batch is run by plain then by speculative decoding before the next), the measured speedup, the
Theorem 3.8 prediction, and the measured cost of the verify call with the prediction it gives in
place of Thm 3.8's one step; compile time, and each decoder's untimed first run on the first
batch (the first touch of its weights and buffers), are reported apart.

    python -m speculative.demo [--prompts 3] [--max_decode_len 128] [--gamma 8] [--staged 3]
        [--tree 2,1,1,1,1,1] [--dtype auto] [--draft_shortlist 32768] [--draft_quantize auto]
        [--temperature 0] [--chat "What is speculative decoding?" ...]

With --chat each question is asked as a user turn through the target's own chat template (the
GGUF file's tokenizer.chat_template, rendered as transformers renders it; --chat_template gives
another), instead of the HumanEval prompts.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from speculative.config import gin_flags
from speculative.jobs.demo import run
from speculative.loading import fetch
from speculative.outputs import logs


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_model_arguments(parser)
    parser.add_argument("--prompts", type=int, default=3, help="first N HumanEval problems")
    parser.add_argument(
        "--chat",
        action="append",
        default=[],
        metavar="QUESTION",
        help="ask this question through the target's chat template instead of the HumanEval "
        "prompts (repeatable: one prompt each)",
    )
    parser.add_argument(
        "--chat_template",
        default=None,
        help="with --chat: the template text or a .jinja file; unset: the model's own",
    )
    parser.add_argument(
        "--batch_size",
        type=int,
        default=1,
        help="rows decoded together (each row accepts its own draft tokens)",
    )
    parser.add_argument(
        "--max_decode_len", type=int, default=128, help="tokens generated at most per prompt"
    )
    parser.add_argument("--gamma", type=int, default=8, help="draft tokens proposed per round")
    parser.add_argument(
        "--tree",
        default="",
        help="a token tree per round instead of a chain of --gamma: widths per depth, e.g. "
        "2,1,1,1,1,1 (docs/design.md §1, token trees); empty: the chain",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0: greedy (output identical to plain decoding); > 0: sampling",
    )
    parser.add_argument("--top_k", type=int, default=0, help="sample among the k likeliest; 0: off")
    parser.add_argument("--top_p", type=float, default=1.0, help="nucleus sampling mass; 1: off")
    parser.add_argument("--debug", action="store_true", help="a traceback instead of one line")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (batch j: seed + j)")
    parser.add_argument(
        "--out",
        default="outputs/demo.json",
        help="where the run's numbers and completions are written (JSON)",
    )
    return parser.parse_args(argv)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's models: which, in what dtype, and the draft's head and staging."""
    models = sorted(fetch.MODELS)
    parser.add_argument(
        "--target",
        default="qwen2.5-coder-1.5b",
        choices=models,
        help="target model: a registry model, fetched once into the cache",
    )
    parser.add_argument(
        "--draft",
        default="qwen2.5-coder-0.5b",
        choices=models,
        help="draft model (same vocabulary as the target)",
    )
    parser.add_argument(
        "--draft_shortlist",
        type=int,
        default=32768,
        help="draft head scores only this many ids (Python stdlib counts + the prompts' ids); 0: all",
    )
    parser.add_argument(
        "--staged",
        type=int,
        default=3,
        help="staged drafting: prompt lookup proposes this many of the draft's tokens per draft "
        "call, verified by the draft in one call (exact; chains only); 0: off",
    )
    add_auto_option(
        parser,
        "--draft_quantize",
        ("none", "int8"),
        "int8: the draft's projection and head weights in int8, its rows quantised per call "
        "(half the bytes a bfloat16 draft step reads; exact: the rule sees the int8 draft's q); "
        "auto: int8 where the CPU has int8 dot units (AMX-INT8 or VNNI), else none",
    )
    add_auto_option(
        parser,
        "--dtype",
        ("float32", "bfloat16"),
        "weights and activations; auto: bfloat16 where the machine has bfloat16 matrix units (or "
        "an accelerator), else float32. Logits are float32 either way",
    )


def add_auto_option(
    parser: argparse.ArgumentParser, flag: str, choices: tuple[str, ...], text: str
) -> None:
    """A choice whose default, 'auto', `models.precision` resolves for the machine it runs on."""
    parser.add_argument(flag, default="auto", choices=["auto", *choices], help=text)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    logs.setup()
    return run.run(args)


if __name__ == "__main__":
    sys.exit(gin_flags.run_job(main))
