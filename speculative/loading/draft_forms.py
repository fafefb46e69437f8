"""A loaded draft model in the form its ModelSpec asks for, applied in this order
(`jobs.common.prepare_drafts`): a shortlist head (`ModelSpec.shortlist`), int8 weights
(`ModelSpec.quantize`, after the shortlist so the shortlist head is int8 too) and staged drafting
(`ModelSpec.staged_lookahead`). Each step is exact: the
acceptance rule sees the q of the draft as it samples."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from speculative import vocab
from speculative.checkpoints import families
from speculative.drafts import shortlist, staged
from speculative.errors import JobError
from speculative.loading import specs as ml
from speculative.models import decoder, int8, padding

log = logging.getLogger(__name__)


def with_shortlist(
    draft: ml.Loaded,
    spec: Any,
    vocabulary: vocab.Vocabulary,
    prompts: Sequence[Sequence[int]],
    role: str = "draft",
) -> ml.Loaded:
    """`draft` with the shortlist head its ModelSpec asks for (`ModelSpec.shortlist` ids, the
    prompts' ids among them); unchanged when the spec asks for none or is not a ModelSpec."""
    size = getattr(spec, "shortlist", 0) if isinstance(spec, ml.ModelSpec) else 0
    if not size:
        return draft
    model, mask = padding.split(draft.model)
    if not families.supports(model, "shortlist"):
        raise JobError(
            f"shortlist needs a decoder-only draft, got {type(model).__name__}", role=role
        )
    if not 1 <= size <= model.vocab_size:
        raise JobError(f"shortlist must be in 1..{model.vocab_size}, got {size}", role=role)
    try:
        ids = shortlist.for_prompts(vocabulary, size, prompts, vocab_size=model.vocab_size)
        config, params = decoder.restrict_head(model.config, draft.params, ids)
    except ValueError as e:
        raise JobError(f"shortlist: {e}", role=role) from e
    restricted = mask(type(model)(config))
    log.info(f"{role}: output head over {len(ids)} of {model.vocab_size} ids (shortlist)")
    return ml.Loaded(restricted, params, draft.description)  # describe(spec) names the shortlist


def with_quantization(loaded: ml.Loaded, spec: Any, role: str = "draft") -> ml.Loaded:
    """`loaded` with its projection and head kernels in int8 (`models.int8.quantize_params`) when
    its ModelSpec asks (`quantize='int8'`); unchanged otherwise. Applied after the shortlist, so
    the shortlist head is quantised too."""
    kind = getattr(spec, "quantize", "") if isinstance(spec, ml.ModelSpec) else ""
    if not kind:
        return loaded
    ml.check_quantization(spec, role)
    model, _ = padding.split(loaded.model)
    if not families.supports(model, "int8"):
        raise JobError(
            f"quantize='int8' needs a decoder-only model, got {type(model).__name__}", role=role
        )
    try:
        params = int8.quantize_params(loaded.params)
    except ValueError as e:
        raise JobError(f"quantize: {e}", role=role) from e
    log.info(f"{role}: projection and head weights in int8, rows quantised per call")
    return ml.Loaded(loaded.model, params, loaded.description)


def with_staging(draft: ml.Loaded, spec: Any, role: str = "draft") -> ml.Loaded:
    """`draft` as a staged drafter (`drafts.staged.StagedDrafter`) when its ModelSpec asks for
    one (`staged_lookahead` > 0); unchanged otherwise."""
    lookahead = getattr(spec, "staged_lookahead", 0) if isinstance(spec, ml.ModelSpec) else 0
    if not lookahead:
        return draft
    ml.check_draft_forms(spec, role)
    if getattr(draft.model, "is_encoder_decoder", False):
        raise JobError("staged drafting needs a decoder-only draft model", role=role)
    log.info(f"{role}: staged drafting, prompt lookup proposes {lookahead} tokens a draft call")
    return ml.Loaded(staged.StagedDrafter(draft.model, lookahead), draft.params, draft.description)
