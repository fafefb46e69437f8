"""Identity driver (issue 42): the infer job on tiny random-weight pairs, one predictions.jsonl a
case. Run from a repository root with PYTHONPATH=that root: python run.py OUT."""

import importlib.util
import json
import pathlib
import sys

spec = importlib.util.spec_from_file_location("js", "/work/main/scripts/job_snapshot.py")
js = importlib.util.module_from_spec(spec)
spec.loader.exec_module(js)
from speculative import infer  # noqa: E402

T5 = ["--gin_file=/tmp/identity_42/t5_random.gin"]
T5X = ["--gin_file=/tmp/identity_42/t5x_target.gin"]
CASES = {
    "decoder_plain": ["--gin.SPECULATIVE=False"],
    "decoder_chain": [],
    "decoder_chain_sampled": js.SAMPLED,
    "decoder_tree": ["--gin.TREE=(2, 2, 1)"],
    "decoder_tree_sampled": ["--gin.TREE=(2, 2, 1)", *js.SAMPLED],
    "t5_plain": [*T5, "--gin.SPECULATIVE=False"],
    "t5_chain": T5,
    "t5_chain_sampled": [*T5, *js.SAMPLED],
    "t5x_target_chain": [*T5, *T5X],
    "gguf_target_chain": ["--gin_file=/tmp/identity_42/gguf_target.gin"],
    "hf_target_tree": ["--gin_file=/tmp/identity_42/hf_target.gin", "--gin.TREE=(2, 2, 1)"],
}
if len(sys.argv) > 2:  # only these cases
    CASES = {name: CASES[name] for name in sys.argv[2:]}
out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
inputs = out / "in.jsonl"
inputs.write_text("".join(json.dumps({"inputs": t}) + "\n" for t in js.PROMPTS))
for name, extra in CASES.items():
    infer.main(js.infer_argv(inputs, out / name, extra))
