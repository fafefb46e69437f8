"""vocab.from_gguf on small GGUF files holding a BPE tokenizer trained here with `tokenizers`.

The reference for every encoding is the trained tokenizer itself (with the Qwen2 split regex taken
from transformers where available), so the test shows that the token list, merges, token types and
pre-tokenizer survive the trip through GGUF metadata.
"""

from __future__ import annotations

import json

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from speculative import vocab
from speculative.vocab.gguf_vocab import from_gguf
from tests import gguf_testutil as gt

CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's 2024, isn't it?",
    "def add(a, b):\n    return a + b\n\nprint(add(12, 30))\n",
    "Speculative decoding drafts tokens with a small model and verifies them with a large one.",
    "    indentation\tand\ttabs\r\nwindows lines\n\n\nmany newlines",
    "Numbers: 3.14159, 1,000,000 and 42; emoji-free text with punctuation!?",
] * 20
TEXTS = [
    "Hello world!",
    "The year 2024 had 366 days; pi is 3.14159.",
    "def f(x):\n    return x ** 2  # square\n\n\n",
    "  leading spaces and trailing   ",
    "Ünïcödé façade naïve 日本語 😀 (bytes the training text never had)",
    "I'm you're they'll WE'VE",
    "tabs\tand\r\nCRLF\n\n  \n",
]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # control (type 3)
USER = ["<tool_call>"]  # user-defined (type 4)
UNUSED = ["[PAD1]"]  # unused (type 5): not matched whole
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def split_for(pre: str):
    if pre == "qwen2":
        transformers_qwen2 = pytest.importorskip("transformers.models.qwen2.tokenization_qwen2")
        regex = transformers_qwen2.PRETOKENIZE_REGEX
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(regex), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )


def train(pre: str) -> tuple[Tokenizer, dict]:
    """A trained byte-level BPE reference and the GGUF tokenizer metadata describing it."""
    ref = Tokenizer(models.BPE())
    ref.pre_tokenizer = split_for(pre)
    ref.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    ref.train_from_iterator(CORPUS, trainer)
    model = json.loads(ref.to_str())["model"]
    by_id = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in by_id] + SPECIALS + USER + UNUSED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    types = [1] * len(by_id) + [3] * len(SPECIALS) + [4] * len(USER) + [5] * len(UNUSED)
    ref.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIALS])
    ref.add_tokens([AddedToken(t, normalized=False, special=False) for t in USER])
    meta = dict(
        tokens=tokens,
        merges=merges,
        token_types=types,
        pre=pre,
        eos_id=tokens.index("<|im_end|>"),
        bos_id=tokens.index("<|endoftext|>"),
        chat_template=CHATML,
    )
    return ref, meta


@pytest.fixture(scope="module", params=["qwen2", "smollm"])
def trained(request, tmp_path_factory):
    ref, meta = train(request.param)
    path = gt.write_tokenizer_only(tmp_path_factory.mktemp("tok") / "t.gguf", **meta)
    return ref, meta, path


def test_encode_matches_reference_and_round_trips(trained):
    ref, meta, path = trained
    v = from_gguf(path)
    assert isinstance(v, vocab.Vocabulary)
    assert list(v.tokens) == meta["tokens"]
    assert v.eos_id == meta["eos_id"]
    for text in TEXTS + CORPUS[:5]:
        ids = v.encode(text)
        assert ids == ref.encode(text).ids, text
        assert v.decode(ids) == text
    assert len(v.encode(CORPUS[0])) < len(CORPUS[0].encode()) / 2  # the merges are used


def test_special_and_user_tokens_stay_whole(trained):
    _, meta, path = trained
    v = from_gguf(path)
    ids = v.encode("<|im_start|>user\nhi<|im_end|><tool_call>[PAD1]")
    pos = {t: meta["tokens"].index(t) for t in SPECIALS + USER + UNUSED}
    assert ids[0] == pos["<|im_start|>"]
    assert pos["<|im_end|>"] in ids and pos["<tool_call>"] in ids
    assert pos["[PAD1]"] not in ids  # unused tokens are only ever produced by id
    assert v.decode(ids) == "<|im_start|>user\nhi<|im_end|><tool_call>[PAD1]"
    assert v.decode(ids, skip_special_tokens=True) == "user\nhi<tool_call>[PAD1]"


def test_bos_follows_metadata(tmp_path):
    _, meta = train("smollm")
    v = from_gguf(gt.write_tokenizer_only(tmp_path / "b.gguf", **dict(meta, add_bos=True)))
    ids = v.encode("Hello")
    assert ids[0] == meta["bos_id"] and len(ids) > 1
    assert v.decode(ids[1:]) == "Hello"


def test_chat_template(trained):
    _, meta, path = trained
    v = from_gguf(path)
    messages = [{"role": "user", "content": "Write add(a, b)."}]
    text = v.apply_chat_template(messages)
    assert text == (
        "<|im_start|>system\nYou are helpful.<|im_end|>\n"
        "<|im_start|>user\nWrite add(a, b).<|im_end|>\n<|im_start|>assistant\n"
    )
    assert v.apply_chat_template(messages, add_generation_prompt=False).endswith("<|im_end|>\n")
    ids = v.encode_chat(messages)
    assert ids.count(meta["tokens"].index("<|im_start|>")) == 3
    assert v.decode(ids) == text


def test_check_compatible(tmp_path):
    _, meta = train("qwen2")
    a = from_gguf(gt.write_tokenizer_only(tmp_path / "a.gguf", **meta))
    b = from_gguf(gt.write_tokenizer_only(tmp_path / "b.gguf", **meta))
    vocab.check_compatible(a, b)

    assert meta["tokens"][-1] == "[PAD1]"  # the trained vocabulary ends with a padding piece
    renamed = meta["tokens"][:-2] + ["<other>", "[PAD9]"]  # padding pieces' names do not matter
    c = from_gguf(gt.write_tokenizer_only(tmp_path / "c.gguf", **dict(meta, tokens=renamed)))
    with pytest.raises(ValueError, match=f"differ at token id {len(renamed) - 2}"):
        vocab.check_compatible(a, c)
    # Trailing "[PAD]" pieces are padding, never produced: compatible, in either role.
    padded = dict(
        meta, tokens=meta["tokens"] + ["[PAD2]", "[PAD3]"], token_types=meta["token_types"] + [5, 5]
    )
    d = from_gguf(gt.write_tokenizer_only(tmp_path / "d.gguf", **padded))
    assert vocab.used_size(d) == vocab.used_size(a) == len(d.tokens) - 3
    vocab.check_compatible(a, d)
    vocab.check_compatible(d, a, draft_model_vocab_size=len(d.tokens) + 6)
    longer = dict(meta, tokens=meta["tokens"] + ["extra"], token_types=meta["token_types"] + [1])
    f = from_gguf(gt.write_tokenizer_only(tmp_path / "f.gguf", **longer))
    with pytest.raises(ValueError, match="differ in size"):
        vocab.check_compatible(a, f)
    e = from_gguf(gt.write_tokenizer_only(tmp_path / "e.gguf", **dict(meta, eos_id=0)))
    with pytest.raises(ValueError, match="EOS"):
        vocab.check_compatible(a, e)


def test_errors(tmp_path):
    _, meta = train("smollm")
    bad_eos = gt.write_tokenizer_only(tmp_path / "f.gguf", **dict(meta, eos_id=10**6))
    with pytest.raises(ValueError, match=r"f\.gguf: EOS id 1000000 is outside"):
        from_gguf(bad_eos)
    with pytest.raises(ValueError, match="unsupported GGUF tokenizer model 'llama'"):
        from_gguf(gt.write_tokenizer_only(tmp_path / "a.gguf", **dict(meta, model="llama")))
    with pytest.raises(ValueError, match=r"b\.gguf: unsupported GGUF pre-tokenizer 'mystery'"):
        from_gguf(gt.write_tokenizer_only(tmp_path / "b.gguf", **dict(meta, pre="mystery")))
    broken = list(meta["tokens"])
    broken[300] = "Ġrenamed"  # a merge result: the merges no longer fit the token list
    with pytest.raises(ValueError, match=r"e\.gguf: .*do not form a BPE vocabulary"):
        from_gguf(gt.write_tokenizer_only(tmp_path / "e.gguf", **dict(meta, tokens=broken)))
    good = gt.write_tokenizer_only(tmp_path / "c.gguf", **meta)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        from_gguf(cut)
    no_template = from_gguf(
        gt.write_tokenizer_only(tmp_path / "d.gguf", **dict(meta, chat_template=None))
    )
    with pytest.raises(
        ValueError, match=r"d\.gguf: no chat template \(looked for tokenizer.chat_template\)"
    ):
        no_template.apply_chat_template([{"role": "user", "content": "hi"}])
