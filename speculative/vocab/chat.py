"""Chat templates: a chat model's own Jinja template, found where its files keep it and rendered as
transformers' `apply_chat_template` renders it, so that the model is asked a question the way it
was trained to be asked.

Where a template comes from, first found wins (`find_template`):
  1. one given by the user: the template text, or a path to a `.jinja` file;
  2. a GGUF file's `tokenizer.chat_template`;
  3. a Hugging Face directory's `chat_template.jinja`, else `tokenizer_config.json`'s
     `chat_template` (a string, or a list of named templates: the one named "default").
No template and none given is a one-line ValueError naming the file and how to give one.

Rendering (`ChatTemplate.render`) is transformers' recipe: a sandboxed jinja2 environment with
`trim_blocks` and `lstrip_blocks`, loop controls, the `tojson` filter (non-ASCII kept),
`raise_exception` and `strftime_now`, the `{% generation %}` block tag, and the variables
`messages`, `tools` (None), `documents` (None), `add_generation_prompt` and the tokenizer's
special tokens by name (`bos_token`, `eos_token`, ...). One difference, on purpose: a top-level
name the template prints or tests for truth but that nobody gave is an error naming it (jinja2's
default renders it as nothing, silently); a missing key of a message (`message.tool_calls`) stays
lenient, and `x is defined` works as ever. The rendered text is tokenized with no special tokens
added (`encode_rendered`): the template writes them itself.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox
import jinja2.utils

# The tokenizer's special tokens a template may print, by transformers' names.
SPECIAL_TOKEN_NAMES = (
    "bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token",
)  # fmt: skip

HOW_TO_GIVE = (
    "give one: CHAT_TEMPLATE = '<path to a .jinja file or the template text>' in gin, "
    "chat_template= in load_pair, or --chat_template in the demo"
)


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: marks the assistant's tokens for training masks
    in transformers; rendering only prints the body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


class _LoudUndefined(jinja2.Undefined):
    """jinja2's lenient Undefined for a missing key or attribute; an error for a top-level name
    nobody gave once the template uses its value."""

    __slots__ = ()

    def _check(self) -> None:
        if self._undefined_obj is jinja2.utils.missing and self._undefined_name is not None:
            raise jinja2.exceptions.UndefinedError(
                f"the template uses the variable {self._undefined_name!r}, which it is not given "
                "(pass it in template_vars)"
            )

    def __str__(self) -> str:
        self._check()
        return ""

    def __iter__(self):
        self._check()
        return iter(())

    def __bool__(self) -> bool:
        self._check()
        return False

    def __len__(self) -> int:
        self._check()
        return 0


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class _Namespace(jinja2.utils.Namespace):
    """`namespace(...)` that refuses underscore-prefixed attributes (no way to CPython's
    internals), as transformers' is."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - jinja2's signature trick
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} starts with '_'")


@functools.lru_cache(maxsize=16)
def _compile(text: str) -> jinja2.Template:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
        undefined=_LoudUndefined,
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = lambda *args, **kwargs: dict(*args, **kwargs)
    env.globals["namespace"] = _Namespace
    return env.from_string(text)


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """The messages as a list of dicts, each with a string `role` and a string (or list of parts)
    `content`; ValueError naming the first bad one."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise ValueError(
            "messages must be a non-empty list of {'role': ..., 'content': ...} dicts, got "
            f"{messages!r:.80}"
        )
    checked = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"message {i} is a {type(message).__name__}, not a mapping")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not role:
            raise ValueError(f"message {i} has no role (a non-empty string), got {role!r}")
        if not isinstance(content, (str, list)):
            raise ValueError(f"message {i} ({role}) has no content string, got {content!r:.80}")
        # keys whose value is None are dropped, as transformers drops them (templates test
        # for a missing key, and would print "None")
        checked.append({k: v for k, v in message.items() if v is not None})
    return checked


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
    """A chat template and the special tokens it may print.

    text: the Jinja source. source: where it was read (named in errors). special_tokens:
    `bos_token` etc. as strings ("" for a token the tokenizer lacks, which transformers renders
    as nothing too).
    """

    text: str
    source: str
    special_tokens: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        template_vars: Mapping[str, Any] | None = None,
    ) -> str:
        """The conversation as the model reads it; with `add_generation_prompt`, the assistant's
        turn opened. ValueError (naming the template's source) when the template cannot be
        parsed, raises on the messages (a role it rejects, say) or uses a name it is not given."""
        checked = check_messages(messages)
        names = {name: "" for name in SPECIAL_TOKEN_NAMES}
        names.update(self.special_tokens)
        names.update(template_vars or {})
        try:
            template = _compile(self.text)
            return template.render(
                messages=checked,
                tools=names.pop("tools", None),
                documents=names.pop("documents", None),
                add_generation_prompt=add_generation_prompt,
                **names,
            )
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise ValueError(f"{self.source}: the chat template does not parse: {e}") from None
        except jinja2.exceptions.TemplateError as e:  # raise_exception, UndefinedError, security
            raise ValueError(f"{self.source}: the chat template refused the messages: {e}") from e


def read_given(given: str) -> ChatTemplate:
    """A user's template: a path to a file holding it, else the text itself."""
    if "{" not in given and os.path.isfile(os.path.expanduser(given)):
        path = os.path.expanduser(given)
        with open(path, encoding="utf-8") as f:
            return ChatTemplate(f.read(), path)
    if "{" not in given:
        raise ValueError(
            f"chat template {given!r} is neither a file nor template text (no '{{' in it)"
        )
    return ChatTemplate(given, "the chat template given")


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {'content': ...}."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def from_hf_directory(directory: str) -> tuple[str | None, str, dict[str, str]]:
    """(template text or None, the file it is read from or would be, special tokens) of a Hugging
    Face directory: chat_template.jinja, else tokenizer_config.json's chat_template."""
    config_path = os.path.join(directory, "tokenizer_config.json")
    config: dict[str, Any] = {}
    if os.path.isfile(config_path):
        try:
            with open(config_path, encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"{config_path}: not readable JSON: {e}") from None
    specials = {}
    for name in SPECIAL_TOKEN_NAMES:
        text = _token_text(config.get(name))
        if text is not None:
            specials[name] = text
    jinja_path = os.path.join(directory, "chat_template.jinja")
    if os.path.isfile(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            return f.read(), jinja_path, specials
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: transformers takes "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise ValueError(f"{config_path}: chat_template is not a string")
    return template, config_path, specials


def find_template(vocabulary: Any, given: str | None = None) -> ChatTemplate:
    """The template to render a vocabulary's conversations with: `given` (text or a path), else
    the one its files carry (a GGUF vocabulary's `chat_template`, a Hugging Face directory's)."""
    specials = dict(getattr(vocabulary, "special_tokens", None) or {})
    if given:
        template = read_given(given)
        return dataclasses.replace(template, special_tokens=specials)
    text = getattr(vocabulary, "chat_template", None)
    source = getattr(vocabulary, "chat_template_source", None) or getattr(
        vocabulary, "source", None
    )
    if not text:
        where = source or f"this {type(vocabulary).__name__}"
        sought = getattr(vocabulary, "chat_template_sought", None)
        looked = f" (looked for {sought})" if sought else " (this kind of vocabulary carries none)"
        raise ValueError(f"{where}: no chat template{looked}; {HOW_TO_GIVE}")
    return ChatTemplate(text, str(source), specials)


def encode_rendered(vocabulary: Any, text: str) -> list[int]:
    """Token ids of a rendered conversation, with no special tokens added (the template wrote
    them), as transformers tokenizes `apply_chat_template`'s text."""
    encode = getattr(vocabulary, "encode_rendered", None)
    if encode is None:
        raise ValueError(
            f"{type(vocabulary).__name__} cannot encode a chat conversation (decoder-only "
            "GGUF and Hugging Face tokenizers can)"
        )
    return encode(text)
