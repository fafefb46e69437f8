"""Conversations through a chat template, turn after turn, each next user turn after the model's
own answer (Spec-Bench's protocol), with every turn's decode timed and its compilation apart.

`Programs` holds the decoders (a `runner.Program` each: plain or speculative decoding bound to its
weights) and compiles each once per prompt width; the first run at a width is untimed (the first
touch of weights and buffers), like the compilation, and both are reported apart. `converse` runs
one program through one conversation at batch 1 and returns a `Turn` per user turn.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from speculative.data import inputs
from speculative.drafts import cross_vocab
from speculative.errors import JobError
from speculative.measure import metrics, timing
from speculative.measure.runner import Program, Run
from speculative.vocab import chat


@dataclasses.dataclass
class Programs:
    """Programs by name, compiled once per prompt width (`width_multiple` rounds a prompt's length
    up: few widths, few compilations). compile_s: seconds per (name, width); warmup_s: seconds of
    each program's untimed first run (its first width only: the first touch of the weights and
    buffers; a later width's first run is timed, as both programs meet it alike)."""

    programs: Mapping[Hashable, Program]
    width_multiple: int = 128
    # program -> the vocabulary of its draft with another tokenizer: given the prompt's text, that
    # draft reads it in its own tokens (`cross_vocab.with_draft_prompts`)
    draft_vocabularies: Mapping[Hashable, Any] = dataclasses.field(default_factory=dict)
    compiled: dict[tuple[Hashable, int], Run] = dataclasses.field(default_factory=dict)
    compile_s: dict[tuple[Hashable, int], float] = dataclasses.field(default_factory=dict)
    warmup_s: dict[tuple[Hashable, int], float] = dataclasses.field(default_factory=dict)

    def width(self, length: int) -> int:
        return -(-length // self.width_multiple) * self.width_multiple

    def run(
        self, name: Hashable, ids: Sequence[int], rng: jax.Array, text: str | None = None
    ) -> tuple[Any, float]:
        """(the output on the host, wall seconds of the timed run) of program `name` on one prompt
        (`text`: what `ids` spell, for a draft with its own tokenizer)."""
        batch = inputs.decoder_batch([ids], pad_to=self.width(len(ids)))
        key: tuple[Hashable, Any] = (name, self.width(len(ids)))
        own = self.draft_vocabularies.get(name)
        if own is not None and text is not None:
            width = self.width(len(own.encode(text)) or 1)
            batch = cross_vocab.with_draft_prompts(batch, own, [text], pad_to=width)
            key = (name, (key[1], width))
        program = self.programs[name]
        if key not in self.compiled:
            if hasattr(program, "validate"):
                program.validate(batch)
            run, self.compile_s[key] = program.compile(batch, rng)
            if not any(n == name for n, _ in self.warmup_s):
                start = time.perf_counter()
                timing.block(run(batch, rng))
                self.warmup_s[key] = time.perf_counter() - start
            self.compiled[key] = run
        start = time.perf_counter()
        out = timing.block(self.compiled[key](batch, rng))
        seconds = time.perf_counter() - start
        return jax.tree.map(np.asarray, out), seconds


@dataclasses.dataclass(frozen=True)
class Turn:
    """One answered user turn: the prompt's length, the answer (text, ids with the stop token,
    their count), the decode's wall seconds and its per-turn statistics (`metrics.summarize`,
    plus the raw counters `pooled` needs)."""

    prompt_tokens: int
    new_tokens: int
    wall_time: float
    text: str
    tokens: list[int]
    stats: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def turn_stats(out: Any) -> dict[str, Any]:
    """Row 0's statistics: `metrics.summarize`'s and the counters it pools from."""
    stats = out.stats
    summary = metrics.summarize(stats, out.lengths)
    if "alpha" in summary:
        summary["verified_at"] = np.asarray(stats["verified_at"])[0].tolist()
        summary["accepted_at"] = np.asarray(stats["accepted_at"])[0].tolist()
    return summary


def pooled(turns: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """`metrics.summarize` over many turns' stats (as `Turn.to_json()` writes them): tokens,
    target calls and tau; alpha (weighted by verified positions), acceptance by position."""
    stats = [t["stats"] for t in turns]
    columns: dict[str, Any] = {"target_calls": np.asarray([s["target_calls"] for s in stats])}
    if stats and all("alpha" in s for s in stats):
        width = max(len(s["verified_at"]) for s in stats)

        def padded(name: str) -> np.ndarray:
            return np.asarray([s[name] + [0] * (width - len(s[name])) for s in stats])

        columns.update(verified_at=padded("verified_at"), accepted_at=padded("accepted_at"))
        for name in ("alpha", "draft_calls", "accepted", "drafted"):
            columns[name] = np.asarray([s[name] for s in stats])
    return metrics.summarize(columns, np.asarray([t["new_tokens"] for t in turns]))


def converse(
    decode: Callable[[Sequence[int], int, str], tuple[Any, float]],
    template: chat.ChatTemplate,
    vocabulary: Any,
    user_turns: Sequence[str],
    *,
    stops: Sequence[int],
    context: int,
    max_new_tokens: int,
    system: str | None = None,
    where: str = "conversation",
) -> list[Turn]:
    """Asks `user_turns` in one conversation: each turn's prompt is the template's rendering of
    everything so far with the assistant's turn opened; the answer (stop tokens dropped) joins the
    conversation before the next user turn.

    decode(ids, turn index, rendered text) -> (output with tokens [1, N] and lengths [1], wall
    seconds).
    context: the target's longest sequence; a turn whose prompt and answer would not fit is a
    JobError naming `where` and the turn, before it is decoded.
    """
    messages = [] if system is None else [{"role": "system", "content": system}]
    turns = []
    for index, user in enumerate(user_turns):
        messages.append({"role": "user", "content": user})
        try:
            text = template.render(messages)
            ids = chat.encode_rendered(vocabulary, text)
        except ValueError as e:
            raise JobError(f"turn {index + 1}: {e}", role=where) from None
        if len(ids) + max_new_tokens > context:
            raise JobError(
                f"turn {index + 1}: the conversation is {len(ids)} tokens, and with "
                f"{max_new_tokens} new tokens it exceeds the model's context of {context}",
                role=where,
            )
        out, seconds = decode(ids, index, text)
        tokens = out.tokens[0, : int(out.lengths[0])].tolist()
        text = vocabulary.decode([t for t in tokens if t not in stops])
        turns.append(Turn(len(ids), len(tokens), seconds, text, tokens, turn_stats(out)))
        messages.append({"role": "assistant", "content": text})
    return turns
