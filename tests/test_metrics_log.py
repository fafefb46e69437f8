"""The trainers' metrics log read back on resume (`job_io.keep_records_up_to`), fuzzed: whatever
a killed run or a damaged disk left, the reader keeps the records a resumed run may keep and
never raises."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from speculative.outputs import job_io

RECORDS = [{"step": s, "loss": 1.0 / s} for s in (10, 20, 30)]


def test_stale_and_torn_lines_are_dropped_atomically(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS) + '{"step": 40, "lo')
    assert job_io.keep_records_up_to(path, 20) == RECORDS[:2]
    assert path.read_text().splitlines() == [json.dumps(r) for r in RECORDS[:2]]
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]
    assert job_io.keep_records_up_to(tmp_path / "none.jsonl", 5) == []


@settings(max_examples=200, deadline=None)
@given(
    junk=st.lists(
        st.binary(max_size=30)
        | st.sampled_from([b"3", b"[1, 2]", b'"x"', b'{"step": "9"}', b'{"step": true}',
                           b'{"loss": 1}', b"\xff\xfe", b'{"step": 15}', b"null"]),
        max_size=6,
    ),
    cut=st.integers(0, 400),
    step=st.integers(0, 40),
)  # fmt: skip
def test_fuzzed_logs_keep_only_records_up_to_the_step(tmp_path_factory, junk, cut, step):
    path = tmp_path_factory.mktemp("log") / "metrics.jsonl"
    good = "".join(json.dumps(r) + "\n" for r in RECORDS).encode()
    path.write_bytes((good + b"\n".join(junk))[: len(good) + cut])
    kept = job_io.keep_records_up_to(path, step)
    assert all(isinstance(r["step"], int) and r["step"] <= step for r in kept)
    assert [r for r in RECORDS if r["step"] <= step] == [r for r in kept if r in RECORDS]
    assert job_io.keep_records_up_to(path, step) == kept  # the rewrite is a fixed point
