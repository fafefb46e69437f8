"""Layer-skip self-drafts: the target's own first k layers, its final norm and its output head.

A self-draft needs no second checkpoint and shares the target's vocabulary by construction. Its
parameters are the target's (the same arrays: `propose` reads the first k layers out of the
target's parameter tree inside jit, so nothing is copied); it keeps its own k-layer cache, since
the target's deeper layers see different inputs. Draft cost is about k / L of a target step (plus
the output head, which it shares). Exact like any model draft: its q is what it samples from.

    drafter = LayerSkipDrafter(target_model, num_layers=4)
    speculative_decode(target_model, params, drafter, params, batch, gamma=..., ...)

Decoder-only targets (`models.decoder.DecoderLM`) only. A target whose padding ids are masked
(`models.padding.PaddingMasked`) gives a draft masked alike, so q never proposes them either.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from speculative.checkpoints import families
from speculative.decoding.model_drafter import ModelDrafter
from speculative.drafts import registry
from speculative.errors import JobError
from speculative.models import padding


@dataclasses.dataclass(frozen=True)
class LayerSkipDrafter(ModelDrafter):
    """The first `num_layers` layers of `target` as a draft; params are the target's own.

    target: a DecoderLM, or one with its padding ids masked (the draft is then masked alike).
    """

    model: Any = dataclasses.field(init=False)
    target: Any
    num_layers: int = 1

    def __post_init__(self):
        bare, mask = padding.split(self.target)
        if not families.supports(bare, "layer_skip"):
            raise ValueError(
                f"layer-skip drafts need a decoder-only DecoderLM target, got {self.target!r}"
            )
        total = bare.config.num_layers
        if not isinstance(self.num_layers, int) or not 1 <= self.num_layers < total:
            raise ValueError(
                f"layer-skip num_layers must be in 1..{total - 1} (the target has {total}), "
                f"got {self.num_layers!r}"
            )
        shallow = dataclasses.replace(bare.config, num_layers=self.num_layers)
        object.__setattr__(self, "model", mask(type(bare)(shallow)))

    def model_params(self, params: Any) -> Any:
        """The target's parameter tree cut to the draft's layers (same arrays, no copy)."""
        keep = {f"layers_{i}" for i in range(self.num_layers)}
        return {k: v for k, v in params.items() if not k.startswith("layers_") or k in keep}

    def check_target(self, target: Any) -> None:
        if target != self.target:
            raise ValueError("a layer-skip draft must be given the target it was built from")

    def place_params(self, partitioner: Any, params: Any) -> Any:
        return partitioner.place_params(padding.split(self.target)[0], params, "target")


# ------------------------------------------------------------------------------------------------
# The 'layer_skip' draft kind (DraftSpec.num_layers).


def _validate(spec: registry.DraftSpec, role: str) -> None:
    if not isinstance(spec.num_layers, int) or spec.num_layers < 1:
        raise JobError(f"{role}: layer_skip num_layers must be an integer >= 1")


def _describe(spec: registry.DraftSpec) -> str:
    return f"layer_skip (the target's first {spec.num_layers} layer(s))"


def _build(spec: registry.DraftSpec, target_model: Any, target_params: Any, role: str):
    bare, _ = padding.split(target_model)
    if not families.supports(bare, "layer_skip"):  # other wrappers are refused too
        raise JobError(f"layer_skip needs a DecoderLM target, got {type(bare).__name__}", role=role)
    try:
        return LayerSkipDrafter(target_model, spec.num_layers), target_params
    except ValueError as e:
        raise JobError(str(e), role=role) from e


DESCRIPTION = "the target's own first num_layers layers (a DecoderLM target, its params)"
registry.register(registry.DraftKind("layer_skip", DESCRIPTION, _build, _validate, _describe))
