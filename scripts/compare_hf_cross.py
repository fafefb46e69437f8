"""`scripts/compare_hf.py --cross_draft NAME`: a draft with another tokenizer on both sides.

Ours: the draft model over its own vocabulary proposing through the token-level intersection
(drafts/cross_vocab.py), fed each prompt's text in its own tokens (`with_draft_prompts`), at each
--cross_gammas. Hugging Face: universal assisted generation, `generate(..., assistant_model=,
tokenizer=, assistant_tokenizer=)`, in each --hf_dtypes, with its default schedule and each
--hf_assistant_tokens: greedy, transformers re-tokenizes the text between the two tokenizers
(AssistedCandidateGeneratorDifferentTokenizers); sampling, its own token-level intersection
(UniversalSpeculativeDecodingGenerator), which prunes the assistant's LM head in place, so the
sampling assistant is a model and tokenizer of its own (transformers caches its translator per
tokenizer pair). Programs keep their side ("ours", "hf <dtype>"), so greedy identity is checked
against that side's plain output like every other program.
"""

from __future__ import annotations

import dataclasses
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import hf_generate
import jax.numpy as jnp

from speculative import checkpoints, decoding, vocab
from speculative.data import inputs
from speculative.drafts import cross_vocab
from speculative.loading import fetch
from speculative.models import decoder
from speculative.vocab import cross_tables

OURS, HF = "ours cross-vocabulary", "hf assisted cross"  # the programs' name prefixes


def is_cross(name: str) -> bool:
    """Whether a program (by name) is one of --cross_draft's."""
    return name.startswith((OURS, HF))


@dataclasses.dataclass(frozen=True)
class CrossProgram:
    """A program's argument: ours, a gamma; Hugging Face, an assistant mode ("default" or an
    int, as `HuggingFace.run`)."""

    mode: Any


class Cross:
    """Both sides' cross-vocabulary programs for the draft `name` (a registry name or .gguf)."""

    def __init__(
        self,
        name: str,
        ours: Any,
        hfs: dict[str, Any],
        texts: Sequence[str],
        prompts: Sequence[Sequence[int]],
    ):
        """ours: compare_hf's `Ours`; hfs: dtype -> its `HuggingFace`; texts and prompts: each
        prompt's text and target ids."""
        start = time.perf_counter()
        self.name, self.ours, self.hfs = name, ours, hfs
        path = pathlib.Path(name) if name.endswith(".gguf") else fetch.ensure_model(name)
        config, params = checkpoints.load_gguf(path, dtype=jnp.dtype(ours.dtype))
        self.vocab = vocab.from_gguf(path)
        tables = cross_tables.build_tables(
            self.vocab, ours.vocab, config.vocab_size, ours.target.vocab_size
        )
        self.tables = cross_tables.describe(tables, vocab.used_size(ours.vocab))
        self.drafter = cross_vocab.make_drafter(decoder.DecoderLM(config), params, tables)
        self.texts = {tuple(ids): text for ids, text in zip(prompts, texts, strict=True)}
        longest = max(len(self.vocab.encode(t)) for t in texts)
        self.width = inputs.bucket(longest, 4096)  # the draft prompts' width: one compilation
        # dtype -> greedy? -> (assistant model, its tokenizer)
        self.assistants = {
            d: {g: (hf_generate.hf_model(path, d), hf_generate.hf_tokenizer(path)) for g in (1, 0)}
            for d in hfs
        }
        self.load_s = time.perf_counter() - start

    def programs(self, gammas: Sequence[int], hf_modes: Sequence[Any]) -> list[tuple]:
        """(name, side, CrossProgram) of ours at each gamma and of HF in each dtype and mode."""
        found = [(f"{OURS} {self.name} gamma {g}", "ours", CrossProgram(g)) for g in gammas]
        for d in self.hfs:
            tag = "" if d == "float32" else f" [{d}]"
            found += [
                (f"{HF} {self.name} {m}{tag}", f"hf {d}", CrossProgram(m))
                for m in ("default", *hf_modes)
            ]
        return found

    def run(self, name, side, program, ids, sampling, stop_ids, seed, warm):
        """(tokens, seconds, stats) of one program on one prompt (target ids `ids`)."""
        if side == "ours":
            ours = self.ours
            config = decoding.DecodeConfig(
                ours.args.max_new_tokens, tuple(stop_ids), sampling, program.mode
            )
            text = self.texts[tuple(ids)]
            batch = cross_vocab.with_draft_prompts(ours.batch(ids), self.vocab, [text], self.width)
            return ours.timed(name, config, batch, seed, lambda: self.drafter)
        dtype = side.removeprefix("hf ")
        hf = self.hfs[dtype]
        assistant, tokenizer = self.assistants[dtype][sampling.greedy]
        return hf.run(
            program.mode, ids, sampling, stop_ids, seed, warm,
            assistant_model=assistant, tokenizer=hf.tokenizer, assistant_tokenizer=tokenizer,
        )  # fmt: skip


def summary(cell: dict[str, Any], tables: str) -> dict[str, Any]:
    """The best of ours and of HF's cross-vocabulary programs in a cell, their ratio, and the
    tables' line (`Cross.tables`); failed programs left out (None where none ran)."""
    table = {n: e for n, e in cell["programs"].items() if "failed" not in e}

    def best(prefix: str) -> str | None:
        names = (n for n in table if n.startswith(prefix))
        return max(names, key=lambda n: table[n]["tok_s"], default=None)

    best_ours, best_hf = best(OURS), best(HF)
    ratio = None
    if best_ours is not None and best_hf is not None:
        ratio = table[best_ours]["tok_s"] / table[best_hf]["tok_s"]
    return dict(best_ours=best_ours, best_hf=best_hf, ours_over_hf=ratio, tables=tables)


def markdown(cross: dict[str, Any]) -> str:
    """One line for a cell's cross-vocabulary `summary`."""
    ratio = "n/a" if cross["ours_over_hf"] is None else f"{cross['ours_over_hf']:.2f}x"
    return (
        f"\nCross-vocabulary draft: best ours ({cross['best_ours']}) / best HF universal "
        f"assisted ({cross['best_hf']}) = {ratio}; {cross['tables']}"
    )
