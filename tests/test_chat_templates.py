"""Chat templates (`vocab.chat`) rendered as transformers' `apply_chat_template` renders them, with
transformers as the oracle: three templates written here in the styles of Qwen (ChatML with a
default system turn and tools), Llama 3 (BOS, a date, trimmed content) and Gemma (strict
alternation, 'model' turns, a `{% generation %}` block), read from a GGUF file, from a Hugging
Face directory (chat_template.jinja and tokenizer_config.json) and given by the user; and every
way a template can fail, loud. The real Qwen and SmolLM2 templates are checked against
transformers in tests/test_real_weights.py (slow).
"""

from __future__ import annotations

import json

import pytest

from speculative.vocab import chat, from_gguf, from_hf
from tests import gguf_testutil as gt
from tests.test_gguf_vocab import train

QWEN_STYLE = """{%- if tools %}
<|im_start|>system
{{- '\\n' + (messages[0].content if messages[0].role == 'system' else 'You are helpful.') }}
{%- for tool in tools %}
{{- '\\n' + (tool | tojson) }}
{%- endfor %}<|im_end|>
{%- elif messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>system\\nYou are helpful. Ünïcödé stays.<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(turns=0) %}
{%- for message in messages %}
{%- if message.role != 'system' or not loop.first %}
{%- set ns.turns = ns.turns + 1 %}
{{- '<|im_start|>' + message.role + '\\n' + message.content }}
{%- if message.tool_calls %}{{ message.tool_calls | tojson }}{% endif %}
{{- '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- endif %}"""

LLAMA_STYLE = """{{- bos_token }}
{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|im_start|>system\\n\\nToday Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|im_end|>" }}
{%- for message in messages %}
    {{- '<|im_start|>' + message['role'] + '\\n\\n' + message['content'] | trim + '<|im_end|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n\\n' }}
{%- endif %}
"""

GEMMA_STYLE = """{{ bos_token }}
{% if messages[0]['role'] == 'system' %}
    {{ raise_exception('System role not supported') }}
{% endif %}
{% for message in messages %}
    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {% endif %}
    {% if (message['role'] == 'assistant') %}
        {% set role = 'model' %}
    {% else %}
        {% set role = message['role'] %}
    {% endif %}
    {{ '<|im_start|>' + role + '\n' }}{% generation %}{{ message['content'] | trim }}{% endgeneration %}{{ '<|im_end|>\n' }}
{% endfor %}
{% if add_generation_prompt %}
    {{'<|im_start|>model\n'}}
{% endif %}"""

TEMPLATES = {"qwen_style": QWEN_STYLE, "llama_style": LLAMA_STYLE, "gemma_style": GEMMA_STYLE}

CONVERSATIONS = [
    [{"role": "user", "content": "Translate: Guten Morgen, wie geht's?"}],
    [
        {"role": "user", "content": "  Write add(a, b).  "},
        {"role": "assistant", "content": "def add(a, b):\n    return a + b\n"},
        {"role": "user", "content": 'Now with "types" and 日本語 comments.'},
    ],
]
WITH_SYSTEM = [{"role": "system", "content": "  Be brief. "}, *CONVERSATIONS[1]]


@pytest.fixture(scope="module")
def hf_tokenizer():
    """transformers' fast tokenizer over the BPE trained in test_gguf_vocab, with BOS and EOS."""
    transformers = pytest.importorskip("transformers")
    ref, meta = train("qwen2")
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=ref, bos_token="<|endoftext|>", eos_token="<|im_end|>"
    )
    return tok, meta


def oracle(tok, template: str, messages, add_generation_prompt: bool = True) -> str:
    return tok.apply_chat_template(
        messages,
        chat_template=template,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )


def conversations_for(name: str):
    extra = [] if name == "gemma_style" else [WITH_SYSTEM]
    return [*CONVERSATIONS, *extra]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_gguf_template_renders_as_transformers(name, hf_tokenizer, tmp_path):
    tok, meta = hf_tokenizer
    template = TEMPLATES[name]
    path = gt.write_tokenizer_only(tmp_path / "t.gguf", **dict(meta, chat_template=template))
    v = from_gguf(path)
    found = chat.find_template(v)
    assert found.source == str(path)
    for messages in conversations_for(name):
        for opened in (True, False):
            ours = found.render(messages, add_generation_prompt=opened)
            assert ours == oracle(tok, template, messages, opened), (name, messages, opened)
        # tokenized as transformers tokenizes the rendered text: no second BOS
        ids = chat.encode_rendered(v, found.render(messages))
        theirs = tok.apply_chat_template(
            messages, chat_template=template, tokenize=True, add_generation_prompt=True
        )
        theirs = theirs["input_ids"] if hasattr(theirs, "keys") else theirs
        assert ids == list(theirs)
        if "bos_token" in template:
            assert ids[0] == meta["bos_id"] and ids[1] != meta["bos_id"]


def test_hf_directory_templates(hf_tokenizer, tmp_path):
    """save_pretrained's chat_template.jinja, and the older tokenizer_config.json field (a string,
    or a list of named templates of which "default" is used)."""
    tok, _ = hf_tokenizer
    tok.chat_template = LLAMA_STYLE
    directory = tmp_path / "hf"
    tok.save_pretrained(directory)
    jinja = directory / "chat_template.jinja"
    v = from_hf(directory)
    assert v.special_tokens["bos_token"] == "<|endoftext|>"
    for messages in conversations_for("llama_style"):
        assert chat.find_template(v).render(messages) == oracle(tok, LLAMA_STYLE, messages)
    assert chat.find_template(v).source == str(jinja)

    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    if jinja.exists():
        jinja.unlink()
    config["chat_template"] = QWEN_STYLE
    config_path.write_text(json.dumps(config))
    found = chat.find_template(from_hf(directory))
    assert found.source == str(config_path)
    assert found.render(WITH_SYSTEM) == oracle(tok, QWEN_STYLE, WITH_SYSTEM)
    config["chat_template"] = [
        {"name": "tool_use", "template": "{{ 'tools' }}"},
        {"name": "default", "template": GEMMA_STYLE},
    ]
    config_path.write_text(json.dumps(config))
    found = chat.find_template(from_hf(directory))
    assert found.render(CONVERSATIONS[1]) == oracle(tok, GEMMA_STYLE, CONVERSATIONS[1])


def test_given_template_wins_and_may_be_a_file(hf_tokenizer, tmp_path):
    tok, meta = hf_tokenizer
    v = from_gguf(gt.write_tokenizer_only(tmp_path / "t.gguf", **meta))  # its own: ChatML
    file = tmp_path / "mine.jinja"
    file.write_text(GEMMA_STYLE)
    by_path = chat.find_template(v, str(file))
    assert by_path.source == str(file)
    by_text = chat.find_template(v, GEMMA_STYLE)
    for found in (by_path, by_text):
        assert found.render(CONVERSATIONS[0]) == oracle(tok, GEMMA_STYLE, CONVERSATIONS[0])
    with pytest.raises(ValueError, match="neither a file nor template text"):
        chat.find_template(v, str(tmp_path / "missing.jinja"))


def test_no_template_says_which_file_and_how_to_give_one(hf_tokenizer, tmp_path):
    tok, meta = hf_tokenizer
    path = gt.write_tokenizer_only(tmp_path / "n.gguf", **dict(meta, chat_template=None))
    with pytest.raises(ValueError, match=r"n\.gguf: no chat template \(looked for tokenizer") as e:
        chat.find_template(from_gguf(path))
    assert "CHAT_TEMPLATE" in str(e.value) and "\n" not in str(e.value)
    tok.chat_template = None
    directory = tmp_path / "hf"
    tok.save_pretrained(directory)
    with pytest.raises(ValueError, match="tokenizer_config.json: no chat template"):
        chat.find_template(from_hf(directory))


def test_template_failures_are_loud():
    found = chat.ChatTemplate(GEMMA_STYLE, "gemma.jinja", {"bos_token": "<s>"})
    with pytest.raises(ValueError, match="gemma.jinja: .*roles must alternate"):
        found.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    with pytest.raises(ValueError, match="System role not supported"):
        found.render(WITH_SYSTEM)
    broken = chat.ChatTemplate("{% for m in messages %}{{ m.content }", "broken.jinja")
    with pytest.raises(ValueError, match="broken.jinja: the chat template does not parse"):
        broken.render(CONVERSATIONS[0])
    # a top-level name nobody gave is an error naming it; `is defined` and missing keys are not
    needs = chat.ChatTemplate("{{ persona }}: {{ messages[0].content }}", "needs.jinja")
    with pytest.raises(ValueError, match="'persona', which it is not given"):
        needs.render(CONVERSATIONS[0])
    assert needs.render(CONVERSATIONS[0], template_vars={"persona": "P"}).startswith("P: ")
    lenient = chat.ChatTemplate(
        "{% if persona is defined %}x{% endif %}{{ messages[0].name }}|{{ tools }}", "ok.jinja"
    )
    assert lenient.render(CONVERSATIONS[0]) == "|None"
    # sandboxed: no way to Python internals
    escape = chat.ChatTemplate("{{ messages.__class__.__mro__ }}", "escape.jinja")
    with pytest.raises(ValueError, match="escape.jinja"):
        escape.render(CONVERSATIONS[0])


@pytest.mark.parametrize(
    "messages, match",
    [
        ([], "non-empty list"),
        ("hello", "non-empty list"),
        (["hello"], "message 0 is a str"),
        ([{"content": "x"}], "message 0 has no role"),
        ([{"role": "user", "content": None}], r"message 0 \(user\) has no content"),
    ],
)
def test_malformed_messages(messages, match):
    with pytest.raises(ValueError, match=match):
        chat.ChatTemplate(QWEN_STYLE, "q.jinja").render(messages)
