"""speculative.data.inputs: reading examples (JSONL, TSV, HumanEval), tokenising, bucketing, padding."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from speculative.data import inputs
from speculative.errors import JobError

# ------------------------------------------------------------------------------------------------
# Reading.


def test_humaneval_prompts():
    rows = inputs.humaneval_prompts()
    assert len(rows) == 164
    assert [r["task_id"] for r in rows[:2]] == ["HumanEval/0", "HumanEval/1"]
    assert rows[-1]["task_id"] == "HumanEval/163"
    assert all("def " + r["entry_point"] + "(" in r["prompt"] for r in rows)
    assert "def has_close_elements(" in rows[0]["prompt"]
    assert rows[0]["entry_point"] == "has_close_elements"
    assert [r["task_id"] for r in inputs.humaneval_prompts(limit=10)] == [
        f"HumanEval/{i}" for i in range(10)
    ]


def test_humaneval_examples_carry_task_id_and_solution():
    examples = inputs.read_examples("humaneval", limit=3)
    assert [e.extra["task_id"] for e in examples] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert [e.index for e in examples] == [0, 1, 2]
    assert examples[0].inputs == inputs.humaneval_prompts(1)[0]["prompt"]
    assert examples[0].targets and examples[0].ids is None


def test_jsonl_plain_and_gzipped_field_limit_and_passthrough(tmp_path):
    rows = [{"text": "first"}, {"text": "second", "id": 2, "other": 1}, {"text": "third"}]
    plain = tmp_path / "p.jsonl"
    plain.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    packed = tmp_path / "p.jsonl.gz"
    with gzip.open(packed, "wt") as f:
        f.write("\n".join(json.dumps(r) for r in rows))
    for path in (plain, packed):
        assert inputs.read_jsonl(path, limit=2) == rows[:2]
        examples = inputs.read_examples(str(path), input_field="text", limit=2)
        assert [e.inputs for e in examples] == ["first", "second"]
        assert examples[1].extra == {"id": 2}  # only the passthrough fields
        assert examples[0].targets is None
    with pytest.raises(JobError, match=r"p\.jsonl:1: no string field 'prompt'"):
        inputs.read_examples(str(plain), input_field="prompt")


def test_malformed_jsonl_is_named_by_line_even_past_the_limit(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n\n{"prompt": \n')
    with pytest.raises(JobError, match=r"bad\.jsonl:3: malformed JSONL line"):
        inputs.read_jsonl(bad)
    # The job checks the whole file before decoding anything, even with a limit.
    with pytest.raises(JobError, match=r"bad\.jsonl:3: malformed JSONL line"):
        inputs.read_examples(str(bad), input_field="prompt", limit=1)
    bad.write_text('{"prompt": "ok"}\n[1, 2]\n')
    with pytest.raises(JobError, match=r"bad\.jsonl:2: expected a JSON object, got list"):
        inputs.read_jsonl(bad)


def test_tsv_inputs_and_malformed_tsv(tmp_path):
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("Good morning.\tGuten Morgen.\n\nThank you.\n")
    examples = inputs.read_examples(str(tsv))
    assert [(e.index, e.inputs, e.targets) for e in examples] == [
        (0, "Good morning.", "Guten Morgen."),
        (1, "Thank you.", None),
    ]
    tsv.write_text("a\tb\nc\td\te\n")
    with pytest.raises(JobError, match=r"pairs\.tsv:2: expected 1 or 2 tab-separated columns"):
        inputs.read_examples(str(tsv))


def test_missing_unknown_and_empty_sources(tmp_path):
    with pytest.raises(JobError, match="does not exist"):
        inputs.read_examples(str(tmp_path / "none.jsonl"))
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(JobError, match="expected a .jsonl"):
        inputs.read_examples(str(tmp_path / "x.csv"))
    (tmp_path / "e.tsv").write_text("\n")
    with pytest.raises(JobError, match="has no examples"):
        inputs.read_examples(str(tmp_path / "e.tsv"))


# ------------------------------------------------------------------------------------------------
# Tokenising and bucketing.


class _Chars:
    """A character vocabulary: id = code point, EOS 1."""

    eos_id = 1

    def encode(self, text):
        return [ord(c) for c in text]


def test_tokenize_truncates_decoder_prompts_at_the_start_and_encoder_inputs_at_the_end():
    examples = [inputs.Example(0, "abcdef"), inputs.Example(1, "xy")]
    vocab = _Chars()
    assert inputs.tokenize(examples, vocab, encoder_decoder=False, max_len=4) == [
        [99, 100, 101, 102],
        [120, 121],
    ]
    assert inputs.tokenize(examples, vocab, encoder_decoder=True, max_len=4) == [
        [97, 98, 99, 1],
        [120, 121, 1],
    ]
    assert inputs.tokenize(examples[:1], vocab, encoder_decoder=False) == [
        [97, 98, 99, 100, 101, 102]
    ]
    # seqio ids end with EOS: encoders keep it, decoder prompts drop it.
    seqio = [inputs.Example(0, "ab", ids=(97, 98, 1))]
    assert inputs.tokenize(seqio, vocab, encoder_decoder=True, max_len=8) == [[97, 98, 1]]
    assert inputs.tokenize(seqio, vocab, encoder_decoder=False, max_len=8) == [[97, 98]]
    with pytest.raises(JobError, match="input 3 is empty"):
        inputs.tokenize([inputs.Example(3, "")], vocab, encoder_decoder=False, max_len=4)


def test_encode_reports_the_untruncated_length():
    vocab = _Chars()
    examples = [inputs.Example(0, "abcdef"), inputs.Example(1, "xy")]
    decoder = inputs.encode(examples, vocab, encoder_decoder=False, max_len=4)
    assert [(e.ids, e.full_length, e.truncated) for e in decoder] == [
        ([99, 100, 101, 102], 6, True),
        ([120, 121], 2, False),
    ]
    encoder = inputs.encode(examples, vocab, encoder_decoder=True, max_len=4)
    assert [(e.full_length, e.truncated) for e in encoder] == [(7, True), (3, False)]  # + EOS
    seqio = [inputs.Example(0, "abcdef", ids=(97, 98, 99, 1))]
    # Untrimmed seqio ids are trimmed as text is: an encoder keeps EOS, a decoder prompt its end.
    encoded = inputs.encode(seqio, vocab, encoder_decoder=True, max_len=2)[0]
    assert (encoded.ids, encoded.full_length, encoded.truncated) == ([97, 1], 4, True)
    encoded = inputs.encode(seqio, vocab, encoder_decoder=False, max_len=2)[0]
    assert (encoded.ids, encoded.full_length, encoded.truncated) == ([98, 99], 3, True)
    assert not inputs.encode(seqio, vocab, encoder_decoder=False, max_len=8)[0].truncated
    with pytest.raises(JobError, match=r"^input f\.jsonl:7: input 3 is empty"):
        inputs.encode([inputs.Example(3, "", source="f.jsonl:7")], vocab, False, 4)


def test_bucket_is_a_power_of_two_at_least_8_capped():
    assert [inputs.bucket(n, 64) for n in (1, 8, 9, 16, 17, 63)] == [8, 8, 16, 16, 32, 64]
    assert inputs.bucket(40, 48) == 48  # capped
    assert inputs.bucket(50, 48) == 50  # never below the length itself


def test_batch_rows_consecutive_and_cycled():
    assert inputs.consecutive_rows(5, 2) == [[0, 1], [2, 3], [4, 4]]
    assert inputs.consecutive_rows(2, 4) == [[0, 1, 1, 1]]
    assert inputs.cycled_rows(3, 2) == [[0, 1], [2, 0]]
    assert inputs.cycled_rows(3, 4) == [[0, 1, 2, 0]]
    assert inputs.cycled_rows(3, 1) == [[0], [1], [2]]


# ------------------------------------------------------------------------------------------------
# Padding.


def test_decoder_batch_right_pads():
    batch = inputs.decoder_batch([[5, 6, 7], [8], [9, 10]])
    np.testing.assert_array_equal(batch["prompt"], [[5, 6, 7], [8, 0, 0], [9, 10, 0]])
    np.testing.assert_array_equal(batch["prompt_lengths"], [3, 1, 2])
    wide = inputs.decoder_batch([[5, 6, 7], [8]], pad_to=5)
    np.testing.assert_array_equal(wide["prompt"], [[5, 6, 7, 0, 0], [8, 0, 0, 0, 0]])
    with pytest.raises(ValueError, match="more than pad_to=2"):
        inputs.decoder_batch([[5, 6, 7]], pad_to=2)


def test_decoder_batch_rejects_empty():
    with pytest.raises(ValueError, match="empty"):
        inputs.decoder_batch([[1], []])
    with pytest.raises(ValueError, match="no prompts"):
        inputs.decoder_batch([])


def test_encoder_batch_pads_with_zero():
    batch = inputs.encoder_batch([[4, 5], [6, 7, 8]])
    np.testing.assert_array_equal(batch["encoder_input_tokens"], [[4, 5, 0], [6, 7, 8]])
    wide = inputs.encoder_batch([[4, 5]], pad_to=4)
    np.testing.assert_array_equal(wide["encoder_input_tokens"], [[4, 5, 0, 0]])


def test_make_batch_picks_the_model_family_layout():
    ids = [[4, 5], [6]]
    decoder = inputs.make_batch(ids, encoder_decoder=False, pad_to=8)
    assert set(decoder) == {"prompt", "prompt_lengths"} and decoder["prompt"].shape == (2, 8)
    encoder = inputs.make_batch(ids, encoder_decoder=True, pad_to=8)
    assert set(encoder) == {"encoder_input_tokens"}
    assert inputs.input_tokens(encoder).shape == inputs.input_tokens(decoder).shape == (2, 8)
