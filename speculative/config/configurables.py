"""Gin registration of the configurable pieces, T5X-style names (`t5.T5Config.emb_dim = 512`).

Every registered model family's model and config classes are configurable under the family's
name (`decoder.DecoderLM`, `decoder.DecoderConfig`, `gemma.GemmaLM`, `t5.T5`, ...;
`checkpoints.families`), so a family's random-weight config needs no line here.

Import this module before parsing gin files; model files bind a `MODEL` macro
(see configs/models/*/base.gin), which `build_model` returns.
"""

from __future__ import annotations

from collections.abc import Sequence

import gin

from speculative import checkpoints as checkpoints  # registers every family
from speculative import decoding
from speculative.checkpoints import families
from speculative.decoding import sampling

for _name in families.names():
    gin.external_configurable(families.get(_name).config, module=_name)
    gin.external_configurable(families.get(_name).model, module=_name)
gin.external_configurable(sampling.SamplingConfig, module="sampling")
gin.external_configurable(decoding.GammaPolicy, module="decoding")


@gin.configurable(module="speculative")
def model_from_macro(model=gin.REQUIRED):
    """Returns whatever `speculative.model_from_macro.model` is bound to (by default %MODEL)."""
    return model


def build_model(config_files: Sequence[str], bindings: Sequence[str] = (), search_path=None):
    """Parses gin files (+ bindings) and returns the model their `MODEL` macro describes.

    Args:
      config_files: gin files, e.g. ["configs/models/t5_1_1/small.gin"].
      bindings: extra bindings, e.g. ["t5.T5Config.dtype = 'bfloat16'"].
      search_path: directory that `include` paths are relative to (default: the current directory).
    Returns:
      The model object (e.g. a `t5.T5`), without weights.
    """
    if search_path is not None:
        gin.add_config_file_search_path(search_path)
    gin.parse_config_files_and_bindings(
        list(config_files), list(bindings) + ["speculative.model_from_macro.model = %MODEL"]
    )
    return model_from_macro()
