"""transformers' side of scripts/compare_hf.py: `generate` on GGUF files (plain, assisted with a
draft model, prompt lookup), timed like ours (one untimed call first), target calls counted.
Needs the `[compare]` extra (torch CPU and transformers)."""

from __future__ import annotations

import os
import pathlib
import time
from typing import Any

from speculative.decoding.sampling import SamplingConfig

# How transformers is asked to load a GGUF file: dense. transformers 5.x keeps a quantized file's
# weights packed in GGUF blocks, unpacked on every forward, where the `kernels` package finds a
# published GGUF kernel for the machine (else it unpacks them at load, with a warning): a packed
# model is not the one a transformers user runs, and its speed would flatter ours.
DENSE = "GgufConfig(dequantize=True)"


def hf_model(path: pathlib.Path, dtype: str) -> Any:
    """transformers' causal LM of a GGUF file, dequantised at load into dense `dtype` weights
    (`DENSE`), in eval mode; RuntimeError if any weight is left packed (`weights_route`)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent,
        gguf_file=path.name,
        dtype=getattr(torch, dtype),
        quantization_config=transformers.GgufConfig(dequantize=True),
    ).eval()
    route = weights_route(model)
    if route["packed_modules"] or route["parameter_dtypes"] != [dtype]:
        raise RuntimeError(f"{path.name}: transformers did not load dense {dtype} weights: {route}")
    return model


def weights_route(model: Any) -> dict[str, Any]:
    """How a transformers model holds its weights: the quantization config it was loaded with,
    its parameters' dtypes and the modules that are not plain torch ones (GGUF-packed layers)."""
    packed = sorted(
        name for name, module in model.named_modules() if "gguf" in type(module).__module__.lower()
    )
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()})
    return {"load": DENSE, "parameter_dtypes": dtypes, "packed_modules": packed}


def hf_tokenizer(path: pathlib.Path) -> Any:
    """transformers' tokenizer of a GGUF file."""
    import transformers

    return transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


class HuggingFace:
    """transformers' generate on the same GGUF files (dense `dtype` weights: `hf_model`); `routes`
    records how each model holds its weights, for the result file."""

    def __init__(self, target_path, draft_path, args, dtype: str = "float32"):
        import torch
        import transformers

        torch.set_num_threads(os.cpu_count() or 1)
        self.torch = torch
        start = time.perf_counter()

        self.target, self.draft = hf_model(target_path, dtype), hf_model(draft_path, dtype)
        self.routes = {"target": weights_route(self.target), "draft": weights_route(self.draft)}
        self.tokenizer = hf_tokenizer(target_path)
        self.load_s = time.perf_counter() - start
        self.calls = 0
        self.target.register_forward_hook(lambda *_: self._count())
        self.args = args
        self.versions = {"torch": torch.__version__, "transformers": transformers.__version__}

    def _count(self):
        self.calls += 1

    def run(self, assistant_tokens, ids, sampling: SamplingConfig, stop_ids, seed, warm, **extra):
        """assistant_tokens: None (plain), "default", an int (constant schedule) or ("lookup", n)
        (prompt-lookup decoding proposing n tokens, no assistant model). extra: generate's
        keyword arguments over these (another assistant_model with its tokenizers, say)."""
        torch = self.torch
        kwargs: dict[str, Any] = dict(
            max_new_tokens=self.args.max_new_tokens,
            eos_token_id=list(stop_ids),
            pad_token_id=stop_ids[0],
        )
        if sampling.greedy:
            kwargs.update(do_sample=False)
        else:  # HF's default top_k is 50: turn it off so both sides sample the same distribution
            kwargs.update(
                do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k or 0
            )
            kwargs.update(top_p=sampling.top_p)
        if isinstance(assistant_tokens, tuple):  # ("lookup", n)
            kwargs["prompt_lookup_num_tokens"] = int(assistant_tokens[1])
        elif assistant_tokens is not None:
            kwargs["assistant_model"] = assistant = extra.get("assistant_model", self.draft)
            if assistant_tokens != "default":
                assistant.generation_config.num_assistant_tokens = int(assistant_tokens)
                assistant.generation_config.num_assistant_tokens_schedule = "constant"
            else:  # transformers' defaults: start at 20, adapt by the heuristic schedule
                assistant.generation_config.num_assistant_tokens = 20
                assistant.generation_config.num_assistant_tokens_schedule = "heuristic"
        kwargs.update(extra)
        prompt = torch.tensor([ids])
        if not warm:  # one untimed call: torch allocates and tunes on first use
            with torch.no_grad():
                torch.manual_seed(seed)
                self.target.generate(prompt, attention_mask=torch.ones_like(prompt), **kwargs)
        self.calls = 0
        with torch.no_grad():
            torch.manual_seed(seed)
            start = time.perf_counter()
            out = self.target.generate(prompt, attention_mask=torch.ones_like(prompt), **kwargs)
            seconds = time.perf_counter() - start
        tokens = out[0, len(ids) :].tolist()
        # generate pads finished sequences; cut after the first stop id as our decoder does
        for i, t in enumerate(tokens):
            if t in stop_ids:
                tokens = tokens[: i + 1]
                break
        return tokens, seconds, {"target_calls": self.calls}
