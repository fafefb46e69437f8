#!/usr/bin/env python
"""docs/exactness.md's tables from the certificate files: one row per certificate (the decode,
its sampling, tokens scored (and the informative ones the uniformity test counts), the mid-PIT
balance's z, the test by place in a round, the uniformity test with the deviation it could see, the stop-token
balance, tokens outside the support, the status, and the plain control where the run had one),
and one row per broken decoder of `scripts/certify_mutants.py` (when its uniformity failed).

    python scripts/certificates_report.py benchmarks/certificates [--noise 584]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys


def decode_label(found: dict) -> str:
    """What was certified, in words: the draft and its forms, the rule, the tree."""
    decode = found.get("decode") or _decode_from_settings(found["settings"])
    draft = decode["draft"]
    name = re.search(r"gguf:([\w.\-]+)", draft)
    label = name.group(1) if name else draft.split(" (")[0].split(":")[0]
    forms = [
        form
        for form, pattern in (
            ("shortlist", r"head shortlist \d+"),
            ("int8", r"int8 weights"),
            ("staged", r"staged by prompt lookup"),
        )
        if re.search(pattern, draft)
    ]
    label += f" ({', '.join(forms)})" if forms else ""
    shape = decode["tree"] or f"γ {decode['gamma']}"
    # on a tree, the 'token' rule is the tree rule (decoding/acceptance/tree.py)
    rule = "tree" if decode["tree"] and decode["acceptance"] == "token" else decode["acceptance"]
    return f"{label}, {shape}, {rule} rule"


def _decode_from_settings(settings: dict) -> dict:
    """The decode of a certificate written before certificates recorded it (its gin settings:
    the draft spec's fields, gamma None = the default 4 of a chain)."""
    draft = settings["draft"]
    path = re.search(r"'path': '([^']+)'", draft)
    forms = {
        "shortlist": (r"'shortlist': [1-9]", "head shortlist 1"),
        "quantize": (r"'quantize': 'int8'", "int8 weights"),
        "staged": (r"'staged_lookahead': [1-9]", "staged by prompt lookup"),
    }
    described = f"gguf:{path.group(1)}" if path else draft
    described += "".join(
        f", {words}" for pattern, words in forms.values() if re.search(pattern, draft)
    )
    gamma = None if settings["gamma"] == "None" else int(settings["gamma"])
    tree = None if settings["tree"] == "None" else f"tree widths {settings['tree']}"
    return {
        "draft": described,
        "gamma": gamma if gamma is not None or tree else 4,
        "tree": tree,
        "acceptance": settings["acceptance"].strip("'"),
    }


def sampling_label(sampling: dict) -> str:
    parts = [f"T {sampling['temperature']:g}"]
    if sampling["top_k"]:
        parts.append(f"top-k {sampling['top_k']}")
    if sampling["top_p"] < 1.0:
        parts.append(f"top-p {sampling['top_p']:g}")
    return ", ".join(parts)


def _tests(program: dict) -> str:
    u, stops = program["uniformity"], program["stops"]
    tokens = f"{program['tokens']}"
    if "informative" in program:  # certificates from before it test every position
        tokens += f" ({program['informative']})"
    balance = program.get("balance")  # certificates from before it have none
    mid = "–" if balance is None else f"{balance['z']:+.2f}"
    return (
        f"{tokens} | {mid} | {_places(program)} | {u['statistic']:.3f} | {u['pvalue']:.2f} | "
        f"{u['detectable_deviation']:.3f} | {stops['emitted']} / {stops['expected']:.1f} | "
        f"{stops['z']:+.2f} | ±{stops['detectable_excess']:.0f} | {program['outside_support']['count']}"
    )


def _places(program: dict) -> str:
    """The test by place in a round: its smallest p and the places tested ("–" before it)."""
    found = program.get("by_offset")
    if found is None or not found["places"]:
        return "–"
    smallest = min(place["pvalue"] for place in found["places"].values())
    return f"{smallest:.2g} ({len(found['places'])})"


def _informative(program: dict) -> str:
    return f" ({program['informative']} informative)" if "informative" in program else ""


def _balance(program: dict) -> str:
    return f", mid-PIT z {program['balance']['z']:+.2f}" if "balance" in program else ""


def table(root: pathlib.Path) -> str:
    """One row per `<root>/<name>/certificate.json`, sorted by name."""
    lines = [
        "| certificate | decode | sampling | tokens (informative) | mid-PIT z | by place: least "
        "p (places) | KS D | KS p | sees D | stops: seen / expected "
        "| stops z | sees stops | outside support | status | plain control |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for path in sorted(root.glob("*/certificate.json")):
        found = json.loads(path.read_text())
        control = found.get("plain")
        control_cell = (
            "none in this run (the chain's at this sampling has one)"
            if control is None
            else f"{control['tokens']} tokens{_informative(control)}{_balance(control)}, KS p {control['uniformity']['pvalue']:.2f}, "
            f"stops z {control['stops']['z']:+.2f}, {'pass' if control['passed'] else 'FAIL'}"
        )
        lines.append(
            f"| `{path.parent.name}` | {decode_label(found)} | "
            f"{sampling_label(found['sampling'])} | {_tests(found['speculative'])} | "
            f"{found['status']} | {control_cell} |"
        )
    return "\n".join(lines)


def mutants_table(path: pathlib.Path) -> str:
    """One row per decoder of a certify_mutants.py file."""
    record = json.loads(path.read_text())
    lines = [
        "| decoder | status | tokens (informative) | mid-PIT z | KS D | KS p | stops z | caught "
        "at (tokens) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, m in record["mutants"].items():
        caught = "not caught" if m["caught_at"] is None else str(m["caught_at"])
        tokens = f"{m['tokens']}" + (f" ({m['informative']})" if "informative" in m else "")
        mid = f"{m['balance_z']:+.2f}" if "balance_z" in m else "–"
        lines.append(
            f"| `{name}` | {m['status']} | {tokens} | {mid} | {m['ks_statistic']:.3f} | "
            f"{m['ks_pvalue']:.2g} | {m['stops_z']:+.2f} | {caught} |"
        )
    return "\n".join(lines)


def shared_noise(n: int) -> tuple[float, list[int]]:
    """The noise every certificate drew before per-run seeds (numpy's default_rng(0)): KS p of its
    first n values against Uniform(0, 1), and their 10-bin histogram (docs/exactness.md, "A false
    alarm, explained")."""
    import numpy as np
    from scipy import stats

    u = np.random.default_rng(0).uniform(size=n)
    return float(stats.kstest(u, "uniform").pvalue), np.histogram(u, 10, (0, 1))[0].tolist()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=pathlib.Path)
    parser.add_argument("--noise", type=int, help="also: the old shared noise's first N values")
    args = parser.parse_args(argv)
    if args.noise:
        pvalue, histogram = shared_noise(args.noise)
        print(f"default_rng(0), first {args.noise}: KS p {pvalue:.3f}, histogram {histogram}\n")
    print(table(args.root))
    for path in sorted(args.root.glob("mutants*.json")):
        print(f"\n{path.name}:\n")
        print(mutants_table(path))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
