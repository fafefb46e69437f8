"""Layer-skip self-drafts: the target's own first k layers, its final norm and its output head.

A self-draft needs no second checkpoint and shares the target's vocabulary by construction. Its
parameters are the target's (the same arrays: `propose` reads the first k layers out of the
target's parameter tree inside jit, so nothing is copied); it keeps its own k-layer cache, since
the target's deeper layers see different inputs. Draft cost is about k / L of a target step (plus
the output head, which it shares). Exact like any model draft: its q is what it samples from.

    drafter = LayerSkipDrafter(target_model, num_layers=4)
    speculative_decode(target_model, params, drafter, params, batch, gamma=..., ...)

Decoder-only targets (`models.decoder.DecoderLM`) only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from speculative.decoding.model_drafter import ModelDrafter
from speculative.models import decoder
from speculative.models.padding import PaddingMasked


@dataclasses.dataclass(frozen=True)
class LayerSkipDrafter(ModelDrafter):
    """The first `num_layers` layers of `target` as a draft; params are the target's own.

    padding: (used, width) when the job masks padding ids out of the target
    (`models.padding.PaddingMasked`): the draft is masked alike, so q never proposes them either.
    """

    model: Any = dataclasses.field(init=False)
    target: decoder.DecoderLM
    num_layers: int = 1
    padding: tuple[int, int] | None = None

    def __post_init__(self):
        if not isinstance(self.target, decoder.DecoderLM):
            raise ValueError(
                f"layer-skip drafts need a decoder-only DecoderLM target, got {self.target!r}"
            )
        total = self.target.config.num_layers
        if not isinstance(self.num_layers, int) or not 1 <= self.num_layers < total:
            raise ValueError(
                f"layer-skip num_layers must be in 1..{total - 1} (the target has {total}), "
                f"got {self.num_layers!r}"
            )
        shallow = dataclasses.replace(self.target.config, num_layers=self.num_layers)
        model: Any = decoder.DecoderLM(shallow)
        if self.padding is not None:
            model = PaddingMasked(model, *self.padding)
        object.__setattr__(self, "model", model)

    def model_params(self, params: Any) -> Any:
        """The target's parameter tree cut to the draft's layers (same arrays, no copy)."""
        keep = {f"layers_{i}" for i in range(self.num_layers)}
        return {k: v for k, v in params.items() if not k.startswith("layers_") or k in keep}

    def check_target(self, target: Any) -> None:
        if isinstance(target, PaddingMasked) and self.padding == (target.used, target.width):
            target = target.model
        if target != self.target:
            raise ValueError("a layer-skip draft must be given the target it was built from")

    def place_params(self, partitioner: Any, params: Any) -> Any:
        return partitioner.place_params(self.target, params, "target")
