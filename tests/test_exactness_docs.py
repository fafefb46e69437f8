"""docs/exactness.md's tables are what `scripts/certificates_report.py` generates from the
committed certificate files (benchmarks/certificates/): a figure edited by hand, or a
certificate added without regenerating the page, fails here. Each committed certificate passed,
from a clean commit, and says where it ran. Pure Python on files in the repository."""

from __future__ import annotations

import json
import pathlib

from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[1]
CERTIFICATES = ROOT / "benchmarks/certificates"


def _report():
    return helpers.load_script("certificates_report")


def test_docs_tables_are_generated_from_the_committed_certificates():
    page = (ROOT / "docs/exactness.md").read_text()
    assert _report().table(CERTIFICATES) in page, "docs/exactness.md: regenerate the table"
    for path in sorted(CERTIFICATES.glob("mutants*.json")):
        table = _report().mutants_table(path)
        assert table in page, f"docs/exactness.md lacks the table of {path.name}; regenerate it"


def test_each_certificate_passed_from_a_clean_commit_and_says_where():
    paths = sorted(CERTIFICATES.glob("*/certificate.json"))
    assert paths
    for path in paths:
        found = json.loads(path.read_text())
        assert found["status"] == "pass", path
        assert found["provenance"]["git_commit"] and found["provenance"]["git_dirty"] is False
        assert found["environment"]["cpu"] and found["environment"]["jax"]
    for path in sorted(CERTIFICATES.glob("mutants*.json")):
        record = json.loads(path.read_text())
        assert record["provenance"]["git_dirty"] is False and record["environment"]["cpu"]


def test_kept_scores_reproduce_each_certificates_statistics():
    """A certificate that kept its scored tokens (scores.json) re-tests to the same numbers:
    the published figures follow from the committed data, with the run's seed and each program's
    index as the PIT noise's seed."""
    from speculative.measure import certificate

    kept = sorted(CERTIFICATES.glob("*/scores.json"))
    for path in kept:
        found = json.loads((path.parent / "certificate.json").read_text())
        scores = json.loads(path.read_text())
        for index, name in enumerate(("speculative", "plain")):
            if name not in found:
                continue
            retested = certificate.tests(
                certificate.Scores.from_json(scores[name]), found["level"],
                seed=(found["plan"]["seed"], index),
            )  # fmt: skip
            for test in ("uniformity", "balance"):
                assert retested[test] == found[name][test], (path, name, test)
            for field in ("emitted", "expected", "z"):  # the p-value's method may be newer
                assert retested["stops"][field] == found[name]["stops"][field], (path, field)
