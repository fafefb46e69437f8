"""Text in, text out, for a notebook: a target and a draft loaded by name or path, and exact
speculative decoding from strings, returning the texts and the run's statistics.

    import speculative
    pair = speculative.load_pair("qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b")
    out = pair.generate(["def fibonacci(n):"], max_new_tokens=64, gamma=5)
    out.texts[0], out.stats["alpha"], out.stats["tau"]

A model is named by a registry name (`speculative.loading.fetch.MODELS`), a .gguf file, a Hugging Face
directory (config.json with safetensors: a decoder-only model, or T5), a T5X checkpoint directory
(then give its architecture, `target_model=`, and `vocabulary=`), or a `speculative.ModelSpec`.
The draft may also be a `speculative.DraftSpec` (prompt lookup, n-gram tables, layer skip, a
feature head) or None (plain decoding of the target).

Loading is the gin jobs' own (`jobs.common.load_models`): the same vocabulary checks, padding masks
and one-line `JobError`s naming the role and the file.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from speculative import vocab
from speculative.data import inputs
from speculative.errors import JobError, check_slot
from speculative.jobs import config as job_config
from speculative.jobs import pairs
from speculative.jobs.certify.config import SamplePlan
from speculative.jobs.certify.run import certify_pair
from speculative.jobs.pairs import LoadedPair, decode_arguments, model_spec
from speculative.loading import specs as ml
from speculative.measure import metrics
from speculative.outputs import logs
from speculative.vocab import chat


@dataclasses.dataclass(frozen=True)
class Generation:
    """What `Pair.generate` returns.

    texts: the completions (stop tokens dropped), one per prompt.
    tokens: their token ids (stop token kept, as decoded).
    stats: `metrics.summarize` of the rows: tokens, target_calls, tau; speculative decoding adds
      alpha, drafted, accepted, draft_calls and acceptance_by_position.
    seconds: wall time of the decode, compilation included (a first call compiles).
    """

    texts: list[str]
    tokens: list[list[int]]
    stats: dict[str, Any]
    seconds: float


def prompt_texts(prompts: Any) -> list[str]:
    """`Pair.generate`'s prompts as a list: one string, or a non-empty sequence of strings."""
    texts = [prompts] if isinstance(prompts, str) else prompts
    if not isinstance(texts, Sequence) or not texts or not all(isinstance(t, str) for t in texts):
        raise JobError(f"prompts must be a string or a non-empty list of strings, got {prompts!r}")
    return list(texts)


@dataclasses.dataclass(frozen=True)
class Pair(LoadedPair):
    """A loaded target, an optional draft (None: plain decoding) and their vocabulary
    (`jobs.pairs.LoadedPair`), decoding strings, conversations and token ids."""

    def generate(self, prompts: str | Sequence[str], **options: Any) -> Generation:
        """Decodes every prompt (one batch, right-padded) with exact speculative decoding, or
        plainly when there is no draft or `speculative` is False. Greedy (temperature 0) output
        is token for token the target's own; sampled output is distributed as the target's.
        The options and their defaults are `decode_ids`'s (max_new_tokens 64, greedy, ...).

        gamma: draft tokens a round; unset, `jobs.config.DEFAULT_GAMMA` (4) for a chain and the
          depth for a tree (a gamma given with a tree must be its depth).
        tree: a token tree proposed each round instead of a chain, widths per depth such as
          (4, 2, 2, 1, 1) or {'parents': (...)} (`decoding.tree`).
        acceptance: a registered rule's name (`decoding.acceptance.names`): 'token' (the
          paper's rule; on a tree, recursive rejection down the tree), 'block' (block
          verification, chains) or 'traversal' (traversal verification, trees); each exact.
        Every argument is checked as the gin jobs check theirs (`jobs.config`): a bad one is a
        one-line `JobError`, with the jobs' message, before anything is decoded.

        Each mode, on tiny random-weight models (a stand-in for real checkpoints: tests run this):

        >>> from speculative.models import decoder
        >>> def tiny(layers):
        ...     config = decoder.DecoderConfig(
        ...         vocab_size=264, emb_dim=32, num_layers=layers, num_heads=4, num_kv_heads=2,
        ...         head_dim=8, mlp_dim=64, max_seq_len=256)
        ...     return speculative.ModelSpec("random", model=decoder.DecoderLM(config))
        >>> byte = speculative.VocabSpec("byte", extra_ids=0)
        >>> pair = speculative.load_pair(tiny(2), tiny(1), vocabulary=byte)
        >>> prompts = ["def add(a, b):", "x = 1; x = 1; x"]
        >>> plain = pair.generate(prompts, max_new_tokens=12, speculative=False)  # plain
        >>> chain = pair.generate(prompts, max_new_tokens=12)  # a chain of 4 drafts a round
        >>> chain.tokens == plain.tokens, chain.stats["drafted"] > 0  # greedy: the target's own
        (True, True)
        >>> tree = pair.generate(prompts, max_new_tokens=12, tree=(4, 2, 2, 1, 1))  # gamma 5
        >>> tree.tokens == plain.tokens
        True
        >>> block = pair.generate(prompts, max_new_tokens=12, gamma=3, acceptance="block")
        >>> block.tokens == plain.tokens
        True
        >>> lookup = speculative.load_pair(
        ...     tiny(2), speculative.DraftSpec("prompt_lookup"), vocabulary=byte)
        >>> lookup.generate(prompts, max_new_tokens=12).tokens == plain.tokens
        True
        >>> alone = speculative.load_pair(tiny(2), vocabulary=byte)  # no draft: plain
        >>> alone.generate(prompts, max_new_tokens=12).texts == plain.texts
        True
        """
        texts, ids = self.tokenized(prompts)
        return self.decode_ids(ids, texts=texts, **options)

    def tokenized(self, prompts: str | Sequence[str]) -> tuple[list[str], list[list[int]]]:
        """The prompts (a string or a list of them) and their ids, as `generate` reads them."""
        texts = prompt_texts(prompts)
        examples = [inputs.Example(i, text) for i, text in enumerate(texts)]
        return texts, inputs.tokenize(
            examples, self.vocabulary, self.target.model.is_encoder_decoder
        )

    def chat(
        self,
        messages: Sequence[Any],
        *,
        chat_template: str | None = None,
        template_vars: dict[str, Any] | None = None,
        **options: Any,
    ) -> Generation:
        """Answers a conversation, or a batch of them, through the target's chat template: messages
        in ({'role': ..., 'content': ...} dicts; a list of such lists for a batch), the
        assistant's next turn out, as `generate` decodes (same keyword options).

        chat_template: the template text or a .jinja path; unset, the model's own (a GGUF file's
        tokenizer.chat_template, a Hugging Face directory's chat_template.jinja or
        tokenizer_config.json). Rendered as transformers' apply_chat_template renders it
        (`vocab.chat`), with the assistant's turn opened, and tokenized with no special tokens
        added. A model without a template, a template that refuses the messages or a variable it
        is not given: one-line `JobError`.
        """
        single = bool(messages) and isinstance(messages[0], Mapping)
        conversations = [messages] if single else list(messages)
        if not conversations:
            raise JobError("chat needs a conversation: a non-empty list of messages")
        try:
            template = chat.find_template(self.vocabulary, chat_template)
            texts = [template.render(c, template_vars=template_vars) for c in conversations]
            ids = [chat.encode_rendered(self.vocabulary, text) for text in texts]
        except ValueError as e:
            raise JobError(str(e), role="chat template") from None
        return self.decode_ids(ids, texts=texts, **options)

    def certify(self, prompts: str | Sequence[str], **options: Any) -> dict[str, Any]:
        """The exactness certificate of this pair's speculative decode with these settings
        (`measure.certificate`, the `python -m speculative.certify` job's): the prompts sampled
        speculatively and plainly, every emitted token scored by the target, teacher-forced, as
        the decoder processes it. options: the sample and the tests (`SamplePlan`:
        rows_per_prompt, seeds, level, max_deviation, control) and the decode
        (`jobs.config.DecodeSettings`: max_new_tokens, gamma, tree, acceptance, temperature, top_k,
        top_p, seed, gamma_policy; T = 1 and 64 tokens unless given). Returns the certificate:
        'status' ('pass', 'fail', 'inconclusive'), 'reasons', and per program the tests,
        p-values, sample sizes and power. An unknown option, too few samples for the power, or
        no draft: one-line `JobError` before anything is decoded. T = 0: identity with plain."""
        planned = {f.name for f in dataclasses.fields(SamplePlan)}
        try:
            plan = SamplePlan(**{k: v for k, v in options.items() if k in planned})
            settings = job_config.DecodeSettings(
                **{"max_new_tokens": 64, "temperature": 1.0}
                | {k: v for k, v in options.items() if k not in planned}
            )
        except TypeError as e:  # an option neither takes
            raise JobError(f"certify: {e}") from None
        texts, ids = self.tokenized(prompts)
        plain, drafting, _ = pairs.decode_configs(vocab.stop_ids(self.vocabulary), settings)
        return certify_pair(self, ids, texts, plain, drafting, plan, settings.seed)

    def decode_ids(
        self,
        ids: Sequence[Sequence[int]],
        *,
        speculative: bool = True,
        max_new_tokens: int = 64,
        gamma: int | None = None,
        tree: Any = None,
        acceptance: str = "token",
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        texts: Sequence[str] | None = None,
    ) -> Generation:
        """Decodes token-id prompts (one batch, right-padded): `generate` and `chat` after their
        prompts are tokenized. texts: what the ids spell, for a draft with its own tokenizer."""
        if not isinstance(speculative, bool):
            raise JobError(f"speculative must be True or False, got {speculative!r}")
        stops = vocab.stop_ids(self.vocabulary)
        plain, drafting, rng = decode_arguments(
            stops, max_new_tokens, gamma, tree, acceptance, temperature, top_k, top_p, seed
        )
        batch = self.batch(ids, texts)
        config = drafting if self.draft is not None and speculative else plain
        start = time.perf_counter()
        out = self.run(batch, config, rng, speculative)
        out = jax.tree.map(np.asarray, out)
        seconds = time.perf_counter() - start
        tokens = [out.tokens[i, : out.lengths[i]].tolist() for i in range(len(ids))]
        decoded = [self.vocabulary.decode([t for t in row if t not in stops]) for row in tokens]
        return Generation(decoded, tokens, metrics.summarize(out.stats, out.lengths), seconds)


def check_slots(target: Any, draft: Any, vocabulary: Any, draft_vocabulary: Any = None) -> None:
    """`load_pair`'s refusal of a spec given in the wrong place (a DraftSpec as the target, say),
    one line naming the argument, as the jobs name the config field (`errors.check_slot`)."""
    described = {str: "a registry name or a path", **ml.SPEC_KINDS}
    check_slot(target, "load_pair target", "target", (str, ml.ModelSpec), described)
    if draft is not None:
        takes = (str, ml.ModelSpec, ml.DraftSpec)
        check_slot(draft, "load_pair draft", "draft", takes, described)
    if vocabulary is not None:
        check_slot(vocabulary, "load_pair vocabulary", "vocabulary", (ml.VocabSpec,), described)
    if draft_vocabulary is not None:
        slot = "load_pair draft_vocabulary"
        check_slot(draft_vocabulary, slot, "draft vocabulary", (ml.VocabSpec,), described)


def load_pair(
    target: str | ml.ModelSpec,
    draft: str | ml.ModelSpec | ml.DraftSpec | None = None,
    *,
    vocabulary: ml.VocabSpec | None = None,
    dtype: str = "auto",
    target_model: Any = None,
    draft_model: Any = None,
    draft_vocabulary: ml.VocabSpec | None = None,
) -> Pair:
    """Loads a target and a draft (see the module docstring for how each may be named).

    vocabulary: needed for T5X checkpoints and random weights; otherwise the target's own.
    draft_vocabulary: the tokenizer of a draft whose checkpoint carries none (T5X, random
      weights); unset, the target's. A draft from a GGUF file or a Hugging Face directory is read
      with the tokenizer its file carries (another one given here is refused: it would be
      ignored). A draft whose vocabulary differs from the target's proposes through
      cross-vocabulary tables (drafts/cross_vocab.py), still exactly.
    Raises JobError (one line naming the role and the file) for what cannot be loaded.
    """
    if not logging.getLogger("speculative").handlers:  # a notebook: show loading and downloads
        logs.setup()
    check_slots(target, draft, vocabulary, draft_vocabulary)
    target_spec = model_spec(target, target_model, dtype)
    draft_spec = None if draft is None else model_spec(draft, draft_model, dtype)
    loaded = pairs.load(target_spec, draft_spec, vocabulary, draft_vocabulary)
    return Pair(**{f.name: getattr(loaded, f.name) for f in dataclasses.fields(loaded)})
