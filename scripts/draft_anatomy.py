#!/usr/bin/env python
"""Where the 0.5B draft's bfloat16 step goes, and whether fusing its projections would pay.

Issue 39's limit is the draft: on the matrix-unit route its step runs at about twice the time its
weights take to stream. This splits the step, on the real weights (Qwen2.5-Coder 0.5B dequantised
from GGUF straight into bfloat16, its 32,768-id shortlist head), one row, cache filled by the
first HumanEval prompt:
  1. the model's whole step (`DecoderLM.extend`, as the decode loop runs it);
  2. its seven projections a layer alone (query, key, value, out, gate, up, down), each the
     library dot the model uses (`base.dense`), chained so nothing is dead code;
  3. the same with the fused layout other stacks use: one [q; k; v] product and one [gate; up]
     product a layer (four dots instead of seven, the same bytes);
  4. the output head alone;
  5. the streaming floor: the weights' bytes at this VM's measured read bandwidth;
  6. the whole step under XLA:CPU's other library fusion types (more operations handed to its
     library per call), with each compiled step's operation count and whether a 6-token block's
     logits still equal six one-token steps' bit for bit (greedy identity's condition).
(1) - (2) - (4) is what the step spends outside the weight products (norms, RoPE, the cache
write, attention, the residual adds); (2) - (3) is what fusing would save. Every variant is a
median of in-loop steps (`measure.timing.step_time`), interleaved round by round. Prints a table
and writes JSON (--out). Run on a quiet machine.

    .venv/bin/python scripts/draft_anatomy.py --out benchmarks/draft_anatomy
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import re
import statistics
import sys

import jax
import jax.numpy as jnp

from speculative import checkpoints, vocab
from speculative.data import inputs
from speculative.drafts import shortlist
from speculative.loading import fetch
from speculative.measure import timing
from speculative.models import base, decoder, precision

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from matrix_units import cpu_model, write_report  # noqa: E402  (the scripts' shared pieces)

# XLA:CPU's library fusion types (jaxlib >= 0.10): which operations it hands to YNNPACK. The
# decode loops use individual dots (`precision.COMPILER_OPTIONS`); the others fuse more per call.
YNN_OPTION = "xla_cpu_experimental_ynn_fusion_type"
FUSION_TYPES = {
    "individual dots (the loops')": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT",
    "dots with their neighbours": "LIBRARY_FUSION_TYPE_DOT",
    "dots and elementwise": "LIBRARY_FUSION_TYPE_DOT,LIBRARY_FUSION_TYPE_ELTWISE",
}


def layer_kernels(params: dict, num_layers: int) -> list[dict[str, jax.Array]]:
    """Each layer's seven projection kernels as 2-D output-major matrices [out, in] (biases left
    out: a few kB)."""
    layers = []
    for i in range(num_layers):
        layer = params[f"layers_{i}"]
        found = {
            "query": layer["self_attention"]["query"]["kernel"],
            "key": layer["self_attention"]["key"]["kernel"],
            "value": layer["self_attention"]["value"]["kernel"],
            "out": layer["self_attention"]["out"]["kernel"],
            "wi_0": layer["mlp"]["wi_0"]["kernel"],
            "wi_1": layer["mlp"]["wi_1"]["kernel"],
            "wo": layer["mlp"]["wo"]["kernel"],
        }
        found["out"] = found["out"].reshape(found["out"].shape[0], -1)  # [E, H, D] -> [E, H*D]
        for name in ("query", "key", "value"):  # [H, D, E] -> [H*D, E]
            found[name] = found[name].reshape(-1, found[name].shape[-1])
        layers.append(found)
    return layers


def fused(layers: list[dict[str, jax.Array]]) -> list[dict[str, jax.Array]]:
    """The same weights laid out as four products a layer: [q; k; v], out, [gate; up], down."""
    return [
        {
            "qkv": jnp.concatenate([layer["query"], layer["key"], layer["value"]]),
            "out": layer["out"],
            "gate_up": jnp.concatenate([layer["wi_0"], layer["wi_1"]]),
            "wo": layer["wo"],
        }
        for layer in layers
    ]


def projections_step(layers: list[dict[str, jax.Array]], x: jax.Array) -> jax.Array:
    """x [R, E] through every layer's projections alone (separate or fused layout) -> [R, E]."""
    for layer in layers:
        if "qkv" in layer:
            qkv = base.dense(x, layer["qkv"])
            # key and value feed the cache in the model; summed in here so they stay live (a
            # slice of a product alone lets XLA shrink the product)
            attn_in = qkv[:, : layer["out"].shape[1]] + jnp.sum(qkv[:, layer["out"].shape[1] :])
            gate, up = jnp.split(base.dense(x, layer["gate_up"]), 2, axis=-1)
        else:
            attn_in = base.dense(x, layer["query"])
            attn_in = attn_in + jnp.sum(base.dense(x, layer["key"]) + base.dense(x, layer["value"]))
            gate, up = base.dense(x, layer["wi_0"]), base.dense(x, layer["wi_1"])
        x = x + base.dense(attn_in, layer["out"])
        x = x + base.dense(jax.nn.silu(gate) * up, layer["wo"])
    return x


def head_step(kernel: jax.Array, x: jax.Array) -> jax.Array:
    """x [R, E] through the output head [S, E]; every logit stays live (a max over them)."""
    return x + jnp.max(base.dense(x, kernel), axis=-1, keepdims=True)


def step_program(model, params, batch: dict, cache_len: int, options: dict | None) -> dict:
    """What one compiled step runs under XLA `options`: its top-level operations (each one call of
    the XLA:CPU runtime, a fixed cost whatever its size), library dots apart, and per layer."""

    def step(params, state, tokens):
        return model.extend(params, state, tokens)[0]

    state = jax.eval_shape(lambda p, b: model.init_state(p, b, cache_len), params, batch)
    tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
    text = jax.jit(step, compiler_options=options).lower(params, state, tokens).compile().as_text()
    entry = text[text.index("ENTRY") :]
    fusions = re.findall(r"^\s+%\S+ = \S+ (\S+?)\(", entry, re.M).count("fusion")
    library = len(re.findall(r"^\s+%\S*ynn_fusion\S* = ", entry, re.M))
    return {
        "library_dots": library,
        "other_fusions": fusions - library,
        "per_layer": fusions / model.config.num_layers,
    }


def block_equals_steps(model, params, batch: dict, cache_len: int, options: dict | None) -> dict:
    """Whether a 6-token verify block's logits equal six one-token steps' bit for bit under XLA
    `options` (the condition of greedy identity in bfloat16, docs/design.md §9)."""
    prefill = jax.jit(
        lambda p, b: model.extend(p, model.init_state(p, b, cache_len), b["prompt"])[1],
        compiler_options=options,
    )
    extend = jax.jit(model.extend, compiler_options=options)
    state = prefill(params, batch)
    tokens = batch["prompt"][:, -6:]
    block = extend(params, state, tokens)[0]
    steps = []
    for i in range(tokens.shape[1]):
        logits, state = extend(params, state, tokens[:, i : i + 1])
        steps.append(logits)
    steps = jnp.concatenate(steps, axis=1)
    # a shortlist head scores the other ids -inf in both: compare the finite logits' values
    finite = jnp.isfinite(block) & jnp.isfinite(steps)
    gap = float(jnp.max(jnp.where(finite, jnp.abs(block - steps), 0.0)))
    return {"identical": bool(jnp.array_equal(block, steps)), "max_abs_difference": gap}


def nbytes(tree) -> int:
    return sum(leaf.nbytes for leaf in jax.tree.leaves(tree))


def first_prompt() -> tuple[vocab.Vocabulary, list, dict, int]:
    """The Qwen vocabulary, the first HumanEval prompt's ids and batch, and a cache length with
    room for 160 more tokens."""
    vocabulary = vocab.from_gguf(fetch.ensure_model("qwen2.5-coder-1.5b"))
    ids = inputs.tokenize(inputs.read_examples("humaneval", limit=1), vocabulary, False)
    batch = inputs.decoder_batch(ids[:1])
    return vocabulary, ids, batch, batch["prompt"].shape[1] + 160


def load_draft() -> tuple[decoder.DecoderLM, dict, dict, int]:
    """The 0.5B draft in bfloat16 with its shortlist head, and `first_prompt`'s batch and cache
    length."""
    vocabulary, ids, batch, cache_len = first_prompt()
    config, params = checkpoints.load_gguf(
        fetch.ensure_model("qwen2.5-coder-0.5b"), dtype=jnp.bfloat16
    )
    short = shortlist.for_prompts(vocabulary, 32768, ids, vocab_size=config.vocab_size)
    config, params = decoder.restrict_head(config, params, short)
    return decoder.DecoderLM(config), params, batch, cache_len


def timed_variants(model, params, batch: dict, cache_len: int) -> dict:
    """name -> a function timing one variant (seconds per step)."""
    separate = layer_kernels(params, model.config.num_layers)
    four = fused(separate)
    head = params["logits_dense"]["kernel"]
    x = jnp.ones((1, model.config.emb_dim), jnp.float32)
    variants = {
        "model_step": lambda: timing.decode_step_time(model, params, batch, cache_len),
        "projections": lambda: timing.step_time(projections_step, separate, x, steps=8),
        "projections_fused": lambda: timing.step_time(projections_step, four, x, steps=8),
        "head": lambda: timing.step_time(head_step, head, x, steps=8),
    }
    if precision.COMPILER_OPTIONS is not None:  # this jaxlib has the fusion-type option
        for name, kinds in list(FUSION_TYPES.items())[1:]:  # the first is model_step's
            variants[f"model_step, {name}"] = functools.partial(
                timing.decode_step_time,
                *(model, params, batch, cache_len),
                compiler_options={YNN_OPTION: kinds},
            )
    return variants


def programs(model, params, batch: dict, cache_len: int) -> dict:
    """Per fusion type: the compiled step's operations and whether a block equals steps."""
    if precision.COMPILER_OPTIONS is None:
        return {"(this jaxlib's defaults)": step_program(model, params, batch, cache_len, None)}
    found = {}
    for name, kinds in FUSION_TYPES.items():
        options = {YNN_OPTION: kinds}
        found[name] = step_program(model, params, batch, cache_len, options)
        found[name].update(block_equals_steps(model, params, batch, cache_len, options))
    return found


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="outputs/draft_anatomy")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per variant")
    args = parser.parse_args(argv)
    model, params, batch, cache_len = load_draft()
    variants = timed_variants(model, params, batch, cache_len)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):  # interleaved
        for name, run in variants.items():
            samples[name].append(run())
    ms = {name: statistics.median(s) * 1e3 for name, s in samples.items()}
    bandwidth = timing.read_bandwidth()
    weight_bytes = nbytes(layer_kernels(params, model.config.num_layers))
    weight_bytes += params["logits_dense"]["kernel"].nbytes
    program = programs(model, params, batch, cache_len)
    ours = next(iter(program.values()))
    report = {
        "cpu": cpu_model(),
        "jax": jax.__version__,
        "draft": "qwen2.5-coder-0.5b, bfloat16, 32768-id shortlist head",
        "rows": 1,
        "cache_len": cache_len,
        "ms": ms,
        "samples_ms": {k: [v * 1e3 for v in s] for k, s in samples.items()},
        "programs": program,
        "weight_bytes": weight_bytes,
        "read_bandwidth_bytes_s": bandwidth,
        "floor_ms": weight_bytes / bandwidth * 1e3,
        "outside_products_ms": ms["model_step"] - ms["projections"] - ms["head"],
        "fusion_saves_ms": ms["projections"] - ms["projections_fused"],
    }
    report["outside_ms_per_operation"] = report["outside_products_ms"] / ours["other_fusions"]
    print_report(report)
    write_report(args.out, "draft_anatomy.json", report)
    return report


def print_report(report: dict) -> None:
    print(f"{report['cpu']}, jax {report['jax']}, {report['draft']}, one row")
    print("| part | ms |\n| --- | --- |")
    for name, value in report["ms"].items():
        print(f"| {name} | {value:.1f} |")
    gb, bw = report["weight_bytes"] / 1e9, report["read_bandwidth_bytes_s"] / 1e9
    print(f"| streaming floor ({gb:.3f} GB at {bw:.1f} GB/s) | {report['floor_ms']:.1f} |")
    print("\n| fusion type | library dots | other operations | a layer | block = steps |")
    print("| --- | --- | --- | --- | --- |")
    for name, p in report["programs"].items():
        same = p.get("identical", "")
        print(
            f"| {name} | {p['library_dots']} | {p['other_fusions']} | {p['per_layer']:.1f} "
            f"| {same} |"
        )
    print(
        f"outside the weight products: {report['outside_products_ms']:.1f} ms "
        f"({report['outside_ms_per_operation'] * 1e3:.0f} us an operation); "
        f"fusing the projections saves {report['fusion_saves_ms']:.1f} ms"
    )


if __name__ == "__main__":
    main()
