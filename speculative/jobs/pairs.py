"""Names and arguments as users give them, turned into what the jobs load and decode with: a
registry name or path into a `ModelSpec` (its format told from the file), the vocabulary a
checkpoint carries, `Pair.generate`-style decode arguments into `DecodeConfig`s, and a loaded
pair (`LoadedPair`: target, draft, vocabularies) that makes batches and decodes them. Shared by the
notebook's `load_pair`, the Spec-Bench job and the certificate job, checked in the jobs' words."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Sequence
from typing import Any

import jax

from speculative import decoding, vocab
from speculative.data import inputs
from speculative.drafts import cross_vocab
from speculative.errors import JobError
from speculative.jobs import common
from speculative.jobs import config as job_config
from speculative.loading import fetch
from speculative.loading import specs as ml


def infer_format(source: str) -> str:
    """The `ModelSpec.format` of a registry name or path: 'gguf', 'hf', 'hf_t5' or 't5x'."""
    if source in fetch.MODELS or source.endswith(".gguf"):
        return "gguf"
    path = pathlib.Path(source).expanduser()
    config = path / "config.json"
    if config.is_file():
        try:
            fields = json.loads(config.read_text())
        except (OSError, ValueError) as e:
            raise JobError(f"config.json is not readable JSON: {e}", path=str(config)) from None
        if not isinstance(fields, dict):
            raise JobError("config.json is not a JSON object", path=str(config))
        model_type = fields.get("model_type")
        return "hf_t5" if model_type in ("t5", "mt5", "umt5") else "hf"
    if (path / "checkpoint").is_file() or (path / "_CHECKPOINT_METADATA").is_file():
        return "t5x"
    if not path.exists():
        known = ", ".join(sorted(fetch.MODELS))
        raise JobError(f"no such file or directory, and not a registry name ({known})", path=source)
    raise JobError(
        "cannot tell the format: expected a .gguf file, a Hugging Face directory (config.json) or "
        "a T5X checkpoint directory; pass a speculative.ModelSpec instead",
        path=source,
    )


def model_spec(source: str | ml.ModelSpec, model: Any = None, dtype: str = "auto") -> Any:
    """A `ModelSpec` for a name or path (a spec, or a `DraftSpec`, is returned as is)."""
    if not isinstance(source, str):
        return source
    fmt = infer_format(source)
    if fmt == "t5x" and model is None:
        raise JobError("a T5X checkpoint needs its architecture: pass target_model= / draft_model=")
    path = (
        source
        if fmt == "gguf" and source in fetch.MODELS
        else str(pathlib.Path(source).expanduser())
    )
    return ml.ModelSpec(fmt, path, model, dtype)


def vocab_spec(spec: ml.ModelSpec) -> ml.VocabSpec:
    """The vocabulary that comes with a model's checkpoint (GGUF, Hugging Face directories)."""
    if spec.format == "gguf":
        return ml.VocabSpec("gguf", spec.path)
    if spec.format == "hf":
        return ml.VocabSpec("hf", spec.path)
    if spec.format == "hf_t5" and (pathlib.Path(spec.path) / "spiece.model").is_file():
        return ml.VocabSpec("sentencepiece", str(pathlib.Path(spec.path) / "spiece.model"))
    raise JobError(f"format {spec.format!r} carries no vocabulary: pass vocabulary=", role="target")


def decode_arguments(
    stops: tuple[int, ...],
    max_new_tokens: Any,
    gamma: Any,
    tree: Any,
    acceptance: Any,
    temperature: Any,
    top_k: Any,
    top_p: Any,
    seed: Any,
    gamma_policy: Any = None,
) -> tuple[decoding.DecodeConfig, decoding.DecodeConfig, jax.Array]:
    """`Pair.generate`'s arguments as (the plain decode's config, the speculative decode's config,
    the key), for `decoding.decode`. Each is refused as the jobs refuse it (`job_config`'s checks,
    their messages; the speculation settings by `job_config.speculation_spec`: a gamma given with
    a tree must be its depth). Left unset, gamma is the tree's depth, or
    `job_config.DEFAULT_GAMMA` for a chain; gamma_policy (a `decoding.GammaPolicy`), unset, fixed."""
    job_config.check_count("max_new_tokens", max_new_tokens)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise JobError(f"seed must be an integer, got {seed!r}")
    sampling = job_config.check_sampling(temperature, top_k, top_p)
    if gamma is not None:
        job_config.check_gamma(gamma, auto=False)
    if tree is None and gamma is None:
        gamma = job_config.DEFAULT_GAMMA
    spec = job_config.speculation_spec(
        gamma, tree, gamma_policy or decoding.GammaPolicy(), 1.0, acceptance, sampling
    )  # the jobs' one check of the speculation settings, in their words
    plain = decoding.DecodeConfig(max_new_tokens, stops, sampling)
    speculative = decoding.DecodeConfig.from_spec(spec, max_new_tokens, stops, sampling)
    return plain, speculative, jax.random.PRNGKey(seed)


def decode_configs(
    stops: tuple[int, ...], settings: job_config.DecodeSettings
) -> tuple[decoding.DecodeConfig, decoding.DecodeConfig, jax.Array]:
    """`decode_arguments` of a job config's `DecodeSettings`."""
    return decode_arguments(
        stops, settings.max_new_tokens, settings.gamma, settings.tree, settings.acceptance,
        settings.temperature, settings.top_k, settings.top_p, settings.seed, settings.gamma_policy,
    )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class LoadedPair:
    """A loaded target, an optional draft (None: plain decoding) and their vocabulary.

    draft_vocabulary: a draft with another tokenizer's own vocabulary (else None): the text of
    each prompt is given to it in its own tokens (`cross_vocab.with_draft_prompts`), not the
    target's ids spelled through the tables, which it would read less well.
    """

    target: ml.Loaded
    draft: ml.Loaded | None
    vocabulary: vocab.Vocabulary
    draft_vocabulary: vocab.Vocabulary | None = None

    def batch(self, ids: Sequence[Sequence[int]], texts: Sequence[str] | None = None) -> dict:
        """The padded batch of the prompts' ids; with their texts and a draft with its own
        tokenizer, each text in the draft's tokens too (draft_prompt [B, W])."""
        batch = inputs.make_batch(ids, self.target.model.is_encoder_decoder)
        if texts is not None and self.draft_vocabulary is not None:
            batch = cross_vocab.with_draft_prompts(batch, self.draft_vocabulary, texts)
        return batch

    def run(
        self, batch: dict, config: decoding.DecodeConfig, rng: jax.Array, speculative: bool = True
    ) -> decoding.DecodeOutput:
        """Decodes a batch by `config`: with the draft (a speculative config), or plainly when
        there is no draft or `speculative` is False (then `config` is a plain decode's)."""
        model, params = self.target.model, self.target.params
        if self.draft is None or not speculative:
            return decoding.decode(model, params, batch, config, rng=rng)
        return decoding.decode(
            model, params, batch, config, draft=self.draft.model, draft_params=self.draft.params,
            rng=rng,
        )  # fmt: skip


def load(
    target: ml.ModelSpec,
    draft: Any = None,
    vocabulary: ml.VocabSpec | None = None,
    draft_vocabulary: ml.VocabSpec | None = None,
    prompts: Sequence[Sequence[int]] = (),
) -> LoadedPair:
    """The target and draft (specs: `model_spec`'s) loaded as every job loads them: the same
    vocabulary checks, padding masks, draft forms (a shortlist head fitted to `prompts`, int8,
    staging) and one-line `JobError`s. vocabulary: unset, the target's own; draft_vocabulary:
    unset, the draft checkpoint's own when `vocabulary` is unset too, else the target's."""
    ml.validate_model_spec(target, "target", model_only=True)  # both before any weight loads
    if draft is not None:
        ml.validate_model_spec(draft, "draft")
    vocabulary_spec = vocabulary or vocab_spec(target)
    drafts = [] if draft is None else [("draft", draft)]
    if drafts and draft_vocabulary is not None:
        own = common.draft_vocabulary_of(draft, draft_vocabulary)
        if own != draft_vocabulary:  # the jobs read such a draft with its file's tokenizer
            raise JobError(
                f"draft_vocabulary={draft_vocabulary!r} would be ignored: a {draft.format} draft "
                f"is read with the tokenizer its file carries ({ml.where(own)}); leave "
                "draft_vocabulary unset (it is for drafts without one: T5X, random weights)"
            )
    if drafts and draft_vocabulary is None and vocabulary is None:
        if isinstance(draft, ml.ModelSpec):
            draft_vocabulary = vocab_spec(draft)
    tokenizer = ml.load_vocabulary(vocabulary_spec)
    loaded = common.load_models(target, drafts, tokenizer, vocabulary_spec, draft_vocabulary)
    loaded = common.prepare_drafts(loaded, drafts, tokenizer, prompts)
    own = None
    if drafts and isinstance(loaded.drafts[0].model, cross_vocab.CrossVocabDrafter):
        spec = common.draft_vocabulary_of(draft, draft_vocabulary)
        own = ml.load_vocabulary(spec, "draft vocabulary")
    return LoadedPair(loaded.target, loaded.drafts[0] if drafts else None, tokenizer, own)
