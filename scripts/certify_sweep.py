"""Several certificates of one loaded pair: a certify gin config's target and draft load once,
then each named decode (overrides of the config's fields, e.g. a tree, a rule, a temperature) is
certified as `python -m speculative.certify` would, its certificate.json in OUT/<name>/ (the same
file; its settings are the decode's, its gin_config the base config's).

    .venv/bin/python scripts/certify_sweep.py --gin_file=configs/certify/qwen_coder.gin \
        --out /tmp/certificates \
        --decode "tree_t1: tree=(4, 2, 2, 1, 1)" \
        --decode "block_nucleus: acceptance='block', temperature=0.7, top_p=0.9, top_k=20"

A decode is `name: field=value, ...` with Python literals for the values (CertifyConfig fields).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from speculative.config import gin_flags  # noqa: E402
from speculative.jobs import pairs  # noqa: E402
from speculative.jobs.certify import run as certify_run  # noqa: E402
from speculative.jobs.certify.config import CertifyConfig  # noqa: E402
from speculative.outputs import logs, provenance  # noqa: E402


def parse_decode(text: str) -> tuple[str, dict]:
    """'name: field=value, ...' -> (name, {field: value}), values as Python literals."""
    name, _, fields = text.partition(":")
    call = ast.parse(f"f({fields})", mode="eval").body
    return name.strip(), {k.arg: ast.literal_eval(k.value) for k in call.keywords}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--decode", action="append", required=True)
    args, rest = parser.parse_known_args(argv)
    logs.setup("INFO")
    decodes = [parse_decode(d) for d in args.decode]
    files = [a.split("=", 1)[1] for a in rest if a.startswith("--gin_file=")]
    bindings = [a.split("=", 1)[1] for a in gin_flags.rewrite_gin_args(rest)
                if a.startswith("--gin_bindings=")]  # fmt: skip
    gin_flags.parse_gin(files, [*bindings, "OUTPUT_DIR = 'unused'"])
    base = CertifyConfig()
    code = provenance.git_state()
    configs = {
        name: dataclasses.replace(base, output_dir=str(pathlib.Path(args.out) / name), **fields)
        for name, fields in decodes
    }
    prepared = {
        name: certify_run.prepare(cfg) for name, cfg in configs.items()
    }  # all checked first
    first = next(iter(prepared.values()))
    pair = pairs.load(
        pairs.model_spec(base.target), pairs.model_spec(base.draft), base.vocabulary,
        prompts=first.ids,
    )  # fmt: skip
    failed = 0
    for name, cfg in configs.items():
        result = certify_run.certify_loaded(cfg, prepared[name], pair, code)
        failed += result["status"] != "pass"
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
