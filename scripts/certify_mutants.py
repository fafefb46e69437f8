"""The certificate against broken decoders on real models: each of the mutation harness's broken
acceptance rules (tests/test_mutations.py) and a draft that misreports its q
(tests/test_certificate.py), run through `certify_pair` on a certify config's pair; for each, the
certificate's status and the fewest tokens at which its uniformity test fails (`caught_at`).

    .venv/bin/python scripts/certify_mutants.py --gin_file=configs/certify/qwen_coder.gin \
        --gin.ROWS_PER_PROMPT=2 --gin.SEEDS=1 --gin.MAX_DEVIATION=0.1 \
        --out benchmarks/certificates/mutants_qwen_t1.json

The pair loads once; each mutant decodes the config's prompts (no plain control: the mutants
leave plain decoding alone) and its tokens are scored. 'exact' (no mutant) runs first.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import pathlib
import sys
import time

import gin

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from speculative.config import gin_flags  # noqa: E402
from speculative.decoding import sampling  # noqa: E402
from speculative.jobs import pairs  # noqa: E402
from speculative.jobs.certify import run as certify_run  # noqa: E402
from speculative.jobs.certify.config import CertifyConfig  # noqa: E402
from speculative.outputs import logs, provenance  # noqa: E402
from tests.test_certificate import misreporting_draft  # noqa: E402
from tests.test_mutations import mutated_verify_detailed, replaced_everywhere  # noqa: E402

MUTANTS = ["accept_all", "residual_abs", "residual_unclamped", "bonus_from_q", "misreported_q"]


def mutant(name: str):
    if name == "exact":
        return contextlib.nullcontext()
    if name == "misreported_q":
        return misreporting_draft()
    return replaced_everywhere(sampling, "verify_detailed", mutated_verify_detailed(name))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--mutants", default=",".join(["exact", *MUTANTS]))
    args, rest = parser.parse_known_args(argv)
    logs.setup("INFO")
    files = [a.split("=", 1)[1] for a in rest if a.startswith("--gin_file=")]
    bindings = [b for a in gin_flags.rewrite_gin_args(rest) if a.startswith("--gin_bindings=")
                for b in [a.split("=", 1)[1]]]  # fmt: skip
    gin_flags.parse_gin(files, [*bindings, "OUTPUT_DIR = '/dev/null'"])
    cfg = CertifyConfig()
    prepared = certify_run.prepare(cfg)
    code = provenance.git_state()
    pair = pairs.load(
        pairs.model_spec(cfg.target), pairs.model_spec(cfg.draft), cfg.vocabulary,
        prompts=prepared.ids,
    )  # fmt: skip
    results = {}
    for name in args.mutants.split(","):
        start = time.perf_counter()
        with mutant(name):
            plan = dataclasses.replace(cfg, control=False)  # the mutants leave plain decoding be
            found = certify_run.certify_pair(
                pair, prepared.ids, prepared.texts, prepared.plain, prepared.speculative, plan,
                cfg.seed,
            )  # fmt: skip
        spec = found["speculative"]
        results[name] = {
            "status": found["status"],
            "reasons": found["reasons"],
            "tokens": spec["tokens"],
            "informative": spec["informative"],
            "balance_z": spec["balance"]["z"],
            "by_offset": spec["by_offset"],
            "ks_pvalue": spec["uniformity"]["pvalue"],
            "ks_statistic": spec["uniformity"]["statistic"],
            "stops_z": spec["stops"]["z"],
            "outside_support": spec["outside_support"]["count"],
            "caught_at": spec["caught_at"],
            "seconds": time.perf_counter() - start,
        }
        print(f"{name}: {json.dumps(results[name])}", flush=True)
    record = {
        "mutants": results,
        "sampling": found["sampling"],
        "plan": found["plan"],
        "level": cfg.level,
        "provenance": {**provenance.record(gin.operative_config_str()), **code},
        "environment": provenance.environment(),
    }
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
