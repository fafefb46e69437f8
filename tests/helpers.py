"""Small real models and exact-distribution utilities shared by the tests."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
import pathlib
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from speculative import decoding
from speculative.decoding import sampling
from speculative.models import decoder, t5


def tiny_decoder_model(
    vocab: int, emb: int, layers: int, heads: int, kv_heads: int
) -> decoder.DecoderLM:
    """A small DecoderLM (QKV bias, untied output, MLP 2 * emb), without weights."""
    config = decoder.DecoderConfig(
        vocab_size=vocab,
        emb_dim=emb,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=emb // heads,
        mlp_dim=2 * emb,
        qkv_bias=True,
        max_seq_len=256,
    )
    return decoder.DecoderLM(config)


def tiny_decoder(vocab: int, emb: int, layers: int, heads: int, kv_heads: int, seed: int):
    """A random-weight `tiny_decoder_model` and its params (untied output: logits ~N(0, 1)).

    `init_params`: one compiled init per config."""
    model = tiny_decoder_model(vocab, emb, layers, heads, kv_heads)
    return model, init_params(model, seed)


@functools.partial(jax.jit, static_argnums=0)
def _init_params(model, rng):
    return model.init_params(rng)


def init_params(model, seed: int):
    """model.init_params(PRNGKey(seed)) as one program compiled once per model config (~1.5 s)
    instead of eagerly, where its hundreds of ops compile one by one for every new set of shapes
    (~3-4.5 s a model on a busy 2-core machine). Equal to the eager init up to float rounding."""
    return _init_params(model, jax.random.PRNGKey(seed))


@functools.partial(jax.jit, static_argnums=(0, 3))
def _prefill_logits(model, params, tokens, max_len):
    state = model.init_state(params, {"prompt": tokens}, max_len)
    return model.extend(params, state, tokens)[0]


def prefill_logits(model, params, tokens, max_len: int | None = None) -> jax.Array:
    """[B, L, V] logits of a decoder-only model's prefill of tokens [B, L] into a cache of max_len
    slots (default L), as one program compiled per model config and shape, not op by op."""
    tokens = jnp.asarray(tokens, jnp.int32)
    return _prefill_logits(model, params, tokens, max_len or tokens.shape[1])


@functools.partial(jax.jit, static_argnums=(0, 3))
def drafter_init(drafter, params, batch, config):
    """`drafter.init(params, batch, config)`, the draft's real prefill, as one program compiled per
    drafter and DecodeConfig instead of op by op."""
    return drafter.init(params, batch, config)


def tiny_t5_config(
    vocab: int,
    emb: int = 32,
    heads: int = 4,
    encoder_layers: int = 2,
    decoder_layers: int = 3,
    head_dim: int = 8,
    mlp: int = 48,
    activations: tuple[str, ...] = ("gelu", "linear"),
    tied: bool = False,
) -> t5.T5Config:
    """A small T5Config. Defaults: `tiny_t5_pair`'s target, T5 v1.1 style (gated GELU MLP, untied
    `logits_dense`); tied=True takes the logits from the embedding (v1.0 style)."""
    return t5.T5Config(
        vocab_size=vocab,
        emb_dim=emb,
        num_heads=heads,
        num_encoder_layers=encoder_layers,
        num_decoder_layers=decoder_layers,
        head_dim=head_dim,
        mlp_dim=mlp,
        mlp_activations=activations,
        logits_via_embedding=tied,
    )


def tiny_t5_pair(vocab: int, seed: int):
    """A random T5 target and a smaller draft made of the target's first layers (so that the two
    agree often but not always, exercising both acceptance and rejection)."""
    target_cfg = tiny_t5_config(vocab)
    draft_cfg = dataclasses.replace(target_cfg, num_encoder_layers=1, num_decoder_layers=1)
    target, draft = t5.T5(target_cfg), t5.T5(draft_cfg)
    target_params = target.init_params(jax.random.PRNGKey(seed))
    draft_params = jax.tree.map(lambda x: x, target_params)
    for stack, kept in (("encoder", 1), ("decoder", 1)):
        draft_params[stack] = {
            k: v
            for k, v in target_params[stack].items()
            if not k.startswith("layers_") or int(k.split("_")[1]) < kept
        }
    assert_same_tree(draft_params, draft.param_shapes())
    return target, target_params, draft, draft_params


def encoder_batch(seed: int, batch: int, width: int, vocab: int):
    """Right-padded random encoder inputs [B, width] (0 = pad); rows 0 and 1 have lengths width, 1."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, width + 1, size=batch)
    lengths[:2] = (width, 1)
    tokens = rng.integers(2, vocab, size=(batch, width))
    tokens = np.where(np.arange(width)[None] < lengths[:, None], tokens, 0)
    return {"encoder_input_tokens": jnp.asarray(tokens, jnp.int32)}


def assert_same_tree(tree, reference) -> None:
    """Asserts equal tree structure and, leaf by leaf, equal shape and dtype."""
    assert jax.tree.structure(tree) == jax.tree.structure(reference)
    for path, leaf, ref in zip(
        jax.tree_util.tree_leaves_with_path(tree),
        jax.tree.leaves(tree),
        jax.tree.leaves(reference),
        strict=True,
    ):
        assert (leaf.shape, leaf.dtype) == (ref.shape, ref.dtype), jax.tree_util.keystr(path[0])


def abstract_decoder(vocab: int, emb: int, layers: int, mlp: int, tied: bool):
    """A GQA DecoderLM (4 heads, 2 kv heads, QKV bias) and its abstract params (no memory)."""
    config = decoder.DecoderConfig(
        vocab_size=vocab,
        emb_dim=emb,
        num_layers=layers,
        num_heads=4,
        num_kv_heads=2,
        head_dim=emb // 4,
        mlp_dim=mlp,
        qkv_bias=True,
        tie_word_embeddings=tied,
        max_seq_len=128,
    )
    model = decoder.DecoderLM(config)
    return model, jax.eval_shape(model.init_params, jax.random.PRNGKey(0))


def abstract_t5(vocab: int, emb: int, layers: int, mlp: int):
    """A T5 v1.1-style model (tied logits) and its abstract params (no memory)."""
    config = tiny_t5_config(
        vocab,
        emb,
        heads=4,
        encoder_layers=layers,
        decoder_layers=layers,
        head_dim=emb // 4,
        mlp=mlp,
        tied=True,
    )
    model = t5.T5(config)
    return model, jax.eval_shape(model.init_params, jax.random.PRNGKey(0))


def compile_count(fn) -> int:
    """How many XLA compilations calling fn() triggers (JAX's public compile log)."""
    import logging

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles():
            fn()
    finally:
        logger.removeHandler(handler)
    return sum("Compiling" in r.getMessage() for r in records)


def ragged_prompts(rng_seed: int, batch: int, width: int, vocab: int, low: int = 1):
    """Right-padded random prompts with lengths 1..width (first row full, second row length 1)."""
    rng = np.random.default_rng(rng_seed)
    lengths = rng.integers(1, width + 1, size=batch)
    lengths[0], lengths[min(1, batch - 1)] = width, 1 if batch > 1 else width
    prompt = rng.integers(low, vocab, size=(batch, width))
    prompt = np.where(np.arange(width)[None, :] < lengths[:, None], prompt, 0)
    return {
        "prompt": jnp.asarray(prompt, jnp.int32),
        "prompt_lengths": jnp.asarray(lengths, jnp.int32),
    }


def _next_token_probs(model, params, rows: jax.Array, first: int, cfg) -> jax.Array:
    """Teacher-forced next-token log-probabilities under `cfg` of rows [R, W] at positions
    first .. W - 1: [R, W - first, V]."""
    state = model.init_state(params, {"prompt": rows}, rows.shape[1])
    logits = model.extend(params, state, rows)[0][:, first:]
    flat = sampling.process_logits(logits.reshape(-1, logits.shape[-1]), cfg)
    return flat.reshape(logits.shape)


_next_token_probs_jit = jax.jit(_next_token_probs, static_argnums=(0, 3, 4))


def exact_sequence_probs(
    model,
    params,
    prompt: list[int],
    length: int,
    vocab: int,
    eos_id: int,
    cfg: sampling.SamplingConfig,
) -> dict[tuple[int, ...], float]:
    """Exact probability of every generated sequence (stopping at EOS or `length` tokens).

    Teacher-forces all vocab ** (length - 1) continuations of the prompt in one compiled call
    (causal attention: a row's logits after its first d tokens are the next-token distribution
    of that prefix), then walks the sequence tree through them.
    """
    continuations = list(itertools.product(range(vocab), repeat=length - 1))
    rows = jnp.asarray([list(prompt) + list(c) for c in continuations], jnp.int32)
    first = len(prompt) - 1
    try:
        hash(model)
        logp = _next_token_probs_jit(model, params, rows, first, cfg)
    except TypeError:  # an unhashable wrapper: compile it as a closure
        logp = jax.jit(lambda p, r: _next_token_probs(model, p, r, first, cfg))(params, rows)
    return walk_sequence_tree(np.exp(np.asarray(logp, np.float64)), length, vocab, eos_id)


def walk_sequence_tree(
    next_probs: np.ndarray, length: int, vocab: int, eos_id: int
) -> dict[tuple[int, ...], float]:
    """Exact probability of every generated sequence (stopping at EOS or `length` tokens) from
    next_probs [R, length, V]: row r holds the next-token probabilities after each prefix of the
    r-th of the vocab ** (length - 1) continuations, in `itertools.product` order."""
    continuations = itertools.product(range(vocab), repeat=length - 1)
    row_of = {c: i for i, c in enumerate(continuations)}
    probs: dict[tuple[int, ...], float] = {}
    frontier = {(): 1.0}
    for depth in range(length):
        new_frontier = {}
        for prefix, mass in frontier.items():
            row_probs = next_probs[row_of[prefix + (0,) * (length - 1 - depth)], depth]
            for token in range(vocab):
                pr = mass * row_probs[token]
                if pr == 0.0:
                    continue
                seq = prefix + (token,)
                if token == eos_id:
                    probs[seq] = probs.get(seq, 0.0) + pr
                else:
                    new_frontier[seq] = pr
        frontier = new_frontier
    probs.update(frontier)
    return probs


def chi_square_pvalue(samples: list[tuple[int, ...]], probs: dict[tuple[int, ...], float]) -> float:
    """Pearson chi-square of samples against exact probabilities, pooling cells expected < 5."""
    n = len(samples)
    counts: dict[tuple[int, ...], int] = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    unexpected = [s for s in counts if s not in probs]
    if unexpected:
        return 0.0  # a sequence with probability 0 was produced
    observed, expected = [], []
    pooled_obs, pooled_exp = 0, 0.0
    for seq, pr in probs.items():
        if pr * n >= 5:
            observed.append(counts.get(seq, 0))
            expected.append(pr * n)
        else:
            pooled_obs += counts.get(seq, 0)
            pooled_exp += pr * n
    if pooled_exp > 0:
        observed.append(pooled_obs)
        expected.append(pooled_exp)
    expected = np.asarray(expected)
    expected *= n / expected.sum()  # float rounding only
    return float(stats.chisquare(observed, expected).pvalue)


def rows_as_sequences(tokens, lengths) -> list[tuple[int, ...]]:
    tokens, lengths = np.asarray(tokens), np.asarray(lengths)
    return [tuple(int(t) for t in row[:n]) for row, n in zip(tokens, lengths)]


def t5_1_1_small(**overrides) -> t5.T5:
    """T5 v1.1 small as released (configs/models/t5_1_1/small.gin), with `overrides` of T5Config
    fields; no weights."""
    config = t5.T5Config(
        vocab_size=32128,
        emb_dim=512,
        num_heads=6,
        num_encoder_layers=8,
        num_decoder_layers=8,
        head_dim=64,
        mlp_dim=1024,
        mlp_activations=("gelu", "linear"),
    )
    return t5.T5(dataclasses.replace(config, **overrides))


# ------------------------------------------------------------------------------------------------
# The decode tests' two setups (fixtures in tests/conftest.py).

# Greedy token identity: a 64-id vocabulary, decodes of 19 tokens (not a multiple of gamma + 1, so
# the length limit falls inside a block).
GREEDY_VOCAB, GREEDY_MAX_LEN = 64, 19

# Sampled exactness: 6 ids, sequences of up to SEQ_LEN tokens after PROMPT (stopping at EOS), N rows
# decoded at once and compared with the exact sequence probabilities by a chi-square test.
SV, SEQ_LEN, EOS, N = 6, 3, 5, 24_000
PROMPT = [1, 3, 2]


def small_target():
    """The sampled checks' target: (model, params) over SV ids."""
    return tiny_decoder(SV, emb=16, layers=1, heads=2, kv_heads=1, seed=10)


def small_draft():
    """An unrelated draft for `small_target` (accepted ~60% of the time)."""
    return tiny_decoder(SV, emb=16, layers=1, heads=2, kv_heads=2, seed=13)


def repeated_prompt(n: int, prompt=PROMPT):
    """n copies of `prompt` as a decoder batch."""
    return {
        "prompt": jnp.tile(jnp.asarray([prompt], jnp.int32), (n, 1)),
        "prompt_lengths": jnp.full((n,), len(prompt), jnp.int32),
    }


def speculative_samples(
    pair, batch, *, gamma, max_decode_len, eos_id, cfg, seed=42, acceptance="token", tree=None
):
    """Speculative decoding of `batch` (rows of one repeated prompt) by a ((target, params),
    (draft, params)) pair: (the rows as sequences, the DecodeOutput), for chi-square tests."""
    (tgt, tgt_params), (drf, drf_params) = pair
    out = decoding.speculative_decode(
        tgt, tgt_params, drf, drf_params, batch, gamma=gamma, max_decode_len=max_decode_len,
        sampling=cfg, eos_id=eos_id, rng=jax.random.PRNGKey(seed), acceptance=acceptance,
        tree=tree,
    )  # fmt: skip
    return rows_as_sequences(out.tokens, out.lengths), out


# ------------------------------------------------------------------------------------------------
# The inference job on the tiny random-weight pair, as the job tests launch it.

TINY_INFER = ["--gin_file=configs/runs/infer.gin", "--gin_file=configs/demo/tiny_random_models.gin"]
QUIET_INFER = [  # no cost timing, no progress bar: job tests check outputs, not speed
    "--gin.speculative.InferConfig.measure_c=False",
    "--gin.speculative.InferConfig.progress=False",
]


# The draft and acceptance job tests: 4 prompts, batches of 2, 12 tokens, gamma 3.
SMALL_INFER = [
    *QUIET_INFER,
    "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 12}",
    "--gin.BATCH_SIZE=2",
    "--gin.GAMMA=3",
]
DRAFT_PROMPTS = ["abcabcabc", "Hi", "x = 1; x = 1; x", "Hello, Hello,"]


def read_outputs(out: pathlib.Path) -> tuple[list[dict], dict]:
    """An infer job's predictions.jsonl rows and summary.json."""
    rows = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    return rows, json.loads((out / "summary.json").read_text())


def tiny_infer(tmp_path: pathlib.Path, name: str, *extra: str) -> tuple[list[dict], dict]:
    """The infer job on the tiny pair (TINY_INFER + SMALL_INFER) over DRAFT_PROMPTS, with `extra`
    flags, into tmp_path/name; run from the repository root. Returns `read_outputs`."""
    from speculative import infer

    inputs = write_jsonl(tmp_path / "in.jsonl", DRAFT_PROMPTS)
    out = tmp_path / name
    flags = [f"--gin.INPUT_FILE='{inputs}'", f"--gin.OUTPUT_DIR='{out}'"]
    infer.main([*TINY_INFER, *SMALL_INFER, *flags, *extra])
    return read_outputs(out)


def infer_matches_plain_draft(tmp_path: pathlib.Path, name: str, flag: str) -> dict:
    """`tiny_infer` with the draft changed by `flag` writes the same greedy outputs as with the
    draft as it is (both equal plain greedy decoding); returns the changed run's summary."""
    rows, _ = tiny_infer(tmp_path, "model")
    changed_rows, summary = tiny_infer(tmp_path, name, flag)
    assert [r["output_ids"] for r in changed_rows] == [r["output_ids"] for r in rows]
    return summary


def write_jsonl(path: pathlib.Path, texts) -> pathlib.Path:
    """Writes one {"inputs": text} row per text to `path`; returns it."""
    path.write_text("".join(json.dumps({"inputs": t}) + "\n" for t in texts))
    return path


# ------------------------------------------------------------------------------------------------
# Modules that need several XLA:CPU host devices, run in a subprocess.

ROOT = pathlib.Path(__file__).resolve().parents[1]


def needs_host_devices(runner_module: str, devices: int = 8):
    """The skip marker of a module that needs `devices` devices; the default suite runs it in a
    subprocess started by `runner_module` (`run_pytest_on_host_devices`)."""
    return pytest.mark.skipif(
        jax.device_count() < devices,
        reason=f"needs {devices} devices; the default suite runs it in a subprocess ({runner_module})",
    )


def host_devices_env(devices: int = 8) -> dict[str, str]:
    """This process's environment with XLA_FLAGS asking for `devices` XLA:CPU host devices."""
    flags = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}"
    return {**os.environ, "XLA_FLAGS": flags.strip(), "JAX_PLATFORMS": "cpu"}


def run_pytest_on_host_devices(
    modules: list[str], report: pathlib.Path, min_tests: int, devices: int = 8, timeout: int = 900
) -> dict[str, int]:
    """Runs pytest on `modules` (paths relative to the repository) in a fresh interpreter with
    `devices` host devices (XLA's device count is fixed when JAX starts, and the suite runs on one
    device); see `run_pytest_in_subprocess`."""
    env = host_devices_env(devices)
    return run_pytest_in_subprocess(
        modules, report, min_tests, env, f"on {devices} devices", timeout
    )


def run_pytest_in_subprocess(
    modules: list[str],
    report: pathlib.Path,
    min_tests: int,
    env: dict[str, str],
    where: str,
    timeout: int = 900,
) -> dict[str, int]:
    """Runs pytest on `modules` in a fresh interpreter with environment `env`, and asserts that at
    least `min_tests` ran, all passed and none was skipped (a module skips itself outside such a
    process). `report` is the JUnit XML file it writes; `where` names the process in failures.
    Returns the counts."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    cmd += [f"--junitxml={report}", *modules]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    log = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"{' '.join(modules)} failed {where}:\n{log}"
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    assert counts["tests"] >= min_tests and counts["failures"] == counts["errors"] == 0, log
    assert counts["skipped"] == 0, f"tests were skipped (not {where}?):\n{log}"
    return counts


# TensorFlow (which seqio needs) and JAX in one process can crash it (both carry XLA and LLVM): the
# tests that import it run in their own interpreter (tests/test_seqio_process.py), which sets this.
TENSORFLOW_PROCESS = "SPECULATIVE_TEST_TENSORFLOW_PROCESS"


def in_tensorflow_process():
    """The skip marker of a module whose tests import TensorFlow: they run only in the interpreter
    tests/test_seqio_process.py starts."""
    return pytest.mark.skipif(
        os.environ.get(TENSORFLOW_PROCESS) != "1",
        reason="imports TensorFlow; the default suite runs it in a subprocess "
        "(tests/test_seqio_process.py)",
    )


# A line of the jobs' log (speculative/outputs/logs.py): "2026-12-03 16:21:21,123 INFO speculative.x: ...".
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


def without_log_lines(text: str) -> str:
    """stderr without the jobs' log lines: what a job printed there itself (its error line)."""
    return "".join(line for line in text.splitlines(True) if not LOG_LINE.match(line))


def load_script(name: str):
    """scripts/<name>.py as a module (the scripts are not a package): its functions for a test."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
