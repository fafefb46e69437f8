"""Real check of the Hugging Face decoder reader (ModelSpec format 'hf') against the GGUF path.

For the demo's Qwen2.5-Coder pair (speculative.loading.fetch MODELS: 0.5B draft, 1.5B Q4_K_M target):
  1. transformers reads each cached GGUF file (AutoModelForCausalLM.from_pretrained(dir,
     gguf_file=...), dequantised to float32) and writes it out as safetensors + tokenizer.json
     under $SPECULATIVE_CACHE/hf_export/<name> (once; one torch model in memory at a time, freed
     before ours load);
  2. for each path (gguf, then hf; only one path's models in memory at a time): load times, both
     tokenizers' ids on a few texts, each model's float32 logits on a few prompts, and greedy
     speculative decoding (gamma 4) of the first HumanEval prompts;
  3. prints the logits' max abs difference, whether tokens and greedy outputs are identical, and
     the load times, as JSON on the last line.

    PYTHONPATH=. python scripts/check_hf_checkpoints.py [--tokens 48] [--prompts 4]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from speculative import decoding, vocab
from speculative.checkpoints import load_gguf, load_hf_decoder
from speculative.data import inputs
from speculative.loading import fetch
from speculative.models.decoder import DecoderLM

PAIR = {"draft": "qwen2.5-coder-0.5b", "target": "qwen2.5-coder-1.5b"}
LOGIT_PROMPTS = [
    "The capital of France is Paris, and the capital of Germany is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "import numpy as np\n\nx = np.arange(10)\nprint(x.",
]
TOKEN_TEXTS = [
    "Hello world!",
    "Ünïcödé façade naïve 日本語のテキスト 😀 emoji",
    "  leading spaces\tand tabs\r\nCRLF   ",
    "<|im_start|>user\nhi<|im_end|>\n",
]


def export(name: str) -> str:
    """The safetensors export of a registry GGUF model (written once by transformers)."""
    out = fetch.default_cache_dir() / "hf_export" / name
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return str(out)
    import torch
    import transformers

    gguf = fetch.ensure_model(name)
    start = time.perf_counter()
    kwargs = dict(gguf_file=gguf.name, dtype=torch.float32)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), **kwargs)
    # transformers marks a model read from GGUF as 'gguf'-quantised and will not save it, though
    # its weights are plain dequantised float32 tensors: drop the marker to write them out.
    model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.save_pretrained(out, safe_serialization=True)
    del model
    gc.collect()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.save_pretrained(out)
    print(f"{name}: exported to {out} in {time.perf_counter() - start:.1f}s")
    return str(out)


def logits(config, params, ids: list[int]) -> np.ndarray:
    """[L, V] float32 logits of one prompt."""
    model = DecoderLM(config)
    tokens = jnp.asarray([ids], jnp.int32)
    state = model.init_state(params, {"prompt": tokens}, len(ids))
    out, _ = model.apply_decoder(params, state, tokens, jnp.arange(len(ids))[None])
    return np.asarray(out[0])


def run_path(kind: str, paths: dict[str, str], prompts: list[str], tokens: int) -> dict:
    """Everything measured on one path (kind 'gguf' or 'hf'); its models are freed on return."""
    loaded, result = {}, {"load_s": {}, "logits": {}}
    for role in ("draft", "target"):
        start = time.perf_counter()
        if kind == "gguf":
            loaded[role] = load_gguf(paths[role], dtype=jnp.float32)
        else:
            loaded[role] = load_hf_decoder(paths[role], dtype=jnp.float32)
        jax.block_until_ready(loaded[role][1])
        result["load_s"][role] = round(time.perf_counter() - start, 2)
    voc = vocab.from_gguf(paths["target"]) if kind == "gguf" else vocab.from_hf(paths["target"])
    result["token_ids"] = [voc.encode(t) for t in TOKEN_TEXTS + LOGIT_PROMPTS]
    result["stop_ids"] = list(vocab.stop_ids(voc))
    for role, (config, params) in loaded.items():
        result["logits"][role] = [logits(config, params, voc.encode(p)) for p in LOGIT_PROMPTS]
    (tc, tp), (dc, dp) = loaded["target"], loaded["draft"]
    batch = inputs.decoder_batch([voc.encode(p) for p in prompts])
    start = time.perf_counter()
    out = decoding.speculative_decode(
        DecoderLM(tc), tp, DecoderLM(dc), dp, batch, gamma=4, max_decode_len=tokens,
        eos_id=vocab.stop_ids(voc),
    )  # fmt: skip
    result["decode_s"] = round(time.perf_counter() - start, 1)
    result["outputs"] = [
        np.asarray(out.tokens[r, : int(out.lengths[r])]).tolist() for r in range(len(prompts))
    ]
    result["text0"] = voc.decode(result["outputs"][0])
    del loaded, tp, dp, out
    gc.collect()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--prompts", type=int, default=4)
    args = parser.parse_args()
    gguf = {role: str(fetch.ensure_model(name)) for role, name in PAIR.items()}
    hf = {role: export(name) for role, name in PAIR.items()}
    prompts = [row["prompt"] for row in inputs.humaneval_prompts(args.prompts)]
    ours = {kind: run_path(kind, paths, prompts, args.tokens) for kind, paths in
            (("gguf", gguf), ("hf", hf))}  # fmt: skip
    g, h = ours["gguf"], ours["hf"]
    report = {
        "tokens_identical": g["token_ids"] == h["token_ids"],
        "stop_ids": {"gguf": g["stop_ids"], "hf": h["stop_ids"]},
        "logits_max_abs_diff": {
            role: max(float(np.abs(a - b).max()) for a, b in zip(g["logits"][role], h["logits"][role]))
            for role in PAIR
        },
        "logits_max_abs": {role: max(float(np.abs(a).max()) for a in g["logits"][role]) for role in PAIR},
        "greedy_speculative_identical": g["outputs"] == h["outputs"],
        "generated_tokens": [len(o) for o in h["outputs"]],
        "load_s": {"gguf": g["load_s"], "hf": h["load_s"]},
        "decode_s": {"gguf": g["decode_s"], "hf": h["decode_s"]},
        "hf_export_bytes": {
            role: sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".safetensors"))
            for role, d in hf.items()
        },
    }  # fmt: skip
    print("first completion (hf path):", repr(h["text0"]))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
