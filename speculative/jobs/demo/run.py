"""The demo behind `python -m speculative.demo` (speculative/demo.py, its command line): speculative
vs plain decoding of real pretrained weights on HumanEval prompts. `run` takes the parsed
arguments: it loads the pair, decodes every batch by plain then speculative decoding, measures c
and the verify cost, prints the completions and the result and writes the result's JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from speculative import checkpoints, decoding, vocab
from speculative.data import chat_inputs, inputs
from speculative.decoding.sampling import SamplingConfig
from speculative.drafts import shortlist, staged
from speculative.errors import LOADER_ERRORS, JobError
from speculative.loading import fetch
from speculative.measure import metrics, runner, timing
from speculative.models import decoder, int8, precision
from speculative.outputs import provenance

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Model:
    """A registry model with its weights and vocabulary."""

    name: str
    model: Any  # a decoder.DecoderLM (a staged drafter wraps the draft's)
    params: Any
    vocabulary: vocab.Vocabulary


def load(name: str, dtype: str = "float32") -> Model:
    """A registry model, fetched on first use, dequantised straight into `dtype`."""
    path = fetch.ensure_model(name)
    start = time.perf_counter()
    config, params = checkpoints.load_gguf(path, dtype=jnp.dtype(dtype))
    log.info(
        f"loaded {name}: {config.num_layers} layers, emb {config.emb_dim}, "
        f"{sum(x.size for x in jax.tree.leaves(params)) / 1e9:.2f}B params "
        f"in {time.perf_counter() - start:.1f}s"
    )
    return Model(name, decoder.DecoderLM(config), params, vocab.from_gguf(path))


def with_shortlist(draft: Model, size: int, examples: Sequence[inputs.Example]) -> Model:
    """The draft with a shortlist head of `size` ids (`drafts.shortlist.for_prompts`); exact,
    and cheaper per step. size 0: the draft unchanged."""
    if not size:
        return draft
    prompts = inputs.tokenize(examples, draft.vocabulary, encoder_decoder=False)
    ids = shortlist.for_prompts(draft.vocabulary, size, prompts, vocab_size=draft.model.vocab_size)
    config, params = decoder.restrict_head(draft.model.config, draft.params, ids)
    log.info(
        f"draft head: {len(ids)} of {draft.model.vocab_size} ids (Python stdlib + the prompts)"
    )
    return Model(
        f"{draft.name} (shortlist {len(ids)})", decoder.DecoderLM(config), params, draft.vocabulary
    )


# ------------------------------------------------------------------------------------------------
# Decoding: every batch by plain, then by speculative decoding.


@dataclasses.dataclass
class Decoded:
    """The demo's decoding, over every batch.

    rows: one per prompt (task_id, completion, tokens, alpha, tau, identical_to_plain).
    tokens: generated tokens of every timed row (copies filling a short last batch included).
    seconds / compile_s: per decoder ("plain", "speculative"), summed over batches.
    warmup_s: per decoder, its untimed first run on the first batch of a shape (the first touch
      of its weights and buffers, which a long-running job pays once, as it pays the compile).
    summary: `metrics.summarize` of the prompts' speculative rows.
    """

    rows: list[dict[str, Any]]
    tokens: int
    seconds: dict[str, float]
    compile_s: dict[str, float]
    warmup_s: dict[str, float]
    summary: dict[str, Any]


def decode_prompts(
    target: Model,
    draft: Model,
    examples: Sequence[inputs.Example],
    config: decoding.DecodeConfig,
    batch_size: int,
    seed: int,
) -> Decoded:
    """Decodes the prompts in batches of batch_size, all padded to one width (one compilation per
    decoder); batch j uses rng PRNGKey(seed + j) for both decoders."""
    ids = inputs.tokenize(examples, target.vocabulary, encoder_decoder=False)
    width = max(len(x) for x in ids)
    members = inputs.consecutive_rows(len(ids), batch_size)
    batches = [
        (inputs.decoder_batch([ids[i] for i in rows], pad_to=width), jax.random.PRNGKey(seed + j))
        for j, rows in enumerate(members)
    ]
    decoders = {
        "plain": runner.Decoder(
            target.model, target.params, dataclasses.replace(config, gamma=None, tree=None)
        ),
        "speculative": runner.Decoder(
            target.model, target.params, config, draft.model, draft.params
        ),
    }
    decoded = Decoded([], 0, *(dict.fromkeys(decoders, 0.0) for _ in range(3)), {})
    stats, lengths = [], []
    greedy = config.sampling.greedy
    for rows, result in zip(members, runner.run_batches(decoders, batches, warmup=True)):
        real = list(dict.fromkeys(rows))  # the copies filling a short last batch are dropped
        spec, plain = jax.tree.map(
            np.asarray, (result.outputs["speculative"], result.outputs["plain"])
        )
        decoded.tokens += int(np.sum(spec.lengths))  # copies are timed too, so count them
        for name in decoders:
            decoded.seconds[name] += result.seconds[name]
            decoded.compile_s[name] += result.compile_s.get(name, 0.0)
            decoded.warmup_s[name] += result.warmup_s.get(name, 0.0)
        kept = first_rows(spec, len(real))
        stats.append(kept.stats)
        lengths.append(kept.lengths)
        for i, index in enumerate(real):
            row = completion(examples[index], spec, plain, i, target.vocabulary, greedy)
            print_completion(examples[index], row)
            decoded.rows.append(row)
    decoded.summary = metrics.summarize(metrics.concat_rows(stats), np.concatenate(lengths))
    return decoded


def first_rows(tree: Any, count: int) -> Any:
    """The first `count` rows of every array in a pytree (e.g. a DecodeOutput)."""
    return jax.tree.map(lambda x: x[:count], tree)


def completion(
    example: inputs.Example,
    spec: decoding.DecodeOutput,
    plain: decoding.DecodeOutput,
    row: int,
    vocabulary: vocab.Vocabulary,
    greedy: bool,
) -> dict[str, Any]:
    """The demo's output row for batch row `row` of the speculative decode (host arrays);
    identical_to_plain only under greedy decoding, where it must hold."""
    n = int(spec.lengths[row])
    same = bool(np.array_equal(spec.tokens[row], plain.tokens[row]))
    return {
        "task_id": example.extra["task_id"],
        "completion": vocabulary.decode(spec.tokens[row, :n].tolist(), skip_special_tokens=True),
        "tokens": n,
        "alpha": float(spec.stats.alpha[row]),
        "tau": float(spec.stats.tokens_per_call[row]),
        "identical_to_plain": same if greedy else None,
    }


def print_completion(example: inputs.Example, row: dict[str, Any]) -> None:
    same = row["identical_to_plain"]
    same = "" if same is None else f", identical to plain greedy: {same}"
    print(
        f"\n=== {row['task_id']} (alpha {row['alpha']:.2f}, tau {row['tau']:.2f}{same}) ===",
        flush=True,
    )
    bold, plain = ("\033[1m", "\033[0m") if sys.stdout.isatty() else ("", "")
    print(prompt_tail(example.inputs) + bold + row["completion"] + plain, flush=True)


def prompt_tail(prompt: str, limit: int = 300) -> str:
    """The end of a prompt, shown above its completion: whole lines, about `limit` characters (at
    least the last line), never from the middle of a word; it ends as the prompt ends."""
    body = prompt.rstrip("\n")
    start = body.rfind("\n") + 1
    while start > 0:
        previous = body.rfind("\n", 0, start - 1) + 1
        if len(prompt) - previous > limit:
            break
        start = previous
    return ("...\n" if start else "") + prompt[start:]


# ------------------------------------------------------------------------------------------------
# The result: measured speedup beside Thm 3.8 and the cost model.


def result_json(
    args: argparse.Namespace,
    config: decoding.DecodeConfig,
    decoded: Decoded,
    costs: dict[str, Any],
    quantize: precision.Route,
) -> dict[str, Any]:
    """demo.json: the run, its pooled statistics, timings and the models' predictions; quantize
    is the draft's weight format as `run` resolved it."""
    gamma, summary = config.gamma, decoded.summary
    c, t_target, t_draft = costs["c"], costs["target_step_s"], costs["draft_step_s"]
    t_verify = costs["target_extend_s"][config.block]
    # the draft's calls a round as counted (a staged draft's lookup saves some of gamma)
    calls = metrics.draft_calls_per_round(summary)
    plain_s, spec_s = decoded.seconds["plain"], decoded.seconds["speculative"]
    return {
        "target": args.target,
        "draft": args.draft,
        "draft_shortlist": args.draft_shortlist,
        "staged_lookahead": args.staged,
        "draft_quantize": quantize.dtype or "none",
        "draft_quantize_route": quantize.reason,
        "batch_size": args.batch_size,
        "dtype": precision.resolve_dtype(args.dtype),
        "dtype_route": precision.resolve(args.dtype).reason,
        "gamma": gamma,
        "tree": list(config.tree.widths) if config.tree is not None else None,
        "verify_tokens": config.block,
        "sampling": dataclasses.asdict(config.sampling),
        "tokens": decoded.tokens,
        "alpha": summary["alpha"],
        "tau": summary["tau"],
        "c": c,
        "target_step_s": t_target,
        "draft_step_s": t_draft,
        "plain_tok_s": decoded.tokens / plain_s,
        "speculative_tok_s": decoded.tokens / spec_s,
        "speedup": plain_s / spec_s,
        "predicted_speedup": metrics.predicted_speedup(summary["alpha"], gamma, c),
        "target_verify_s": t_verify,
        "draft_calls_per_round": calls,
        "cost_model_speedup": metrics.cost_model_speedup(
            summary["tau"], calls, t_target, t_draft, t_verify
        ),
        "optimal_gamma": metrics.optimal_gamma(summary["alpha"], c),
        "compile_s": decoded.compile_s,
        "warmup_s": decoded.warmup_s,
        "acceptance_by_position": summary["acceptance_by_position"],
        "rows": decoded.rows,
        "provenance": provenance.record(None),  # argparse flags, no gin config
        "environment": provenance.environment(),  # time, command line, jax, CPU and flags
    }


def print_result(r: dict[str, Any]) -> None:
    gamma = r["gamma"]
    print(
        f"\n{r['target']} <- draft {r['draft']} (head shortlist: {r['draft_shortlist'] or 'off'}, "
        f"weights: {'int8' if r['draft_quantize'] == 'int8' else r['dtype']}): "
        f"{r['tokens']} tokens, batch {r['batch_size']}, {r['dtype']}, "
        + (f"tree {r['tree']} (depth {gamma})" if r["tree"] else f"gamma {gamma}")
    )
    print(
        f"alpha {r['alpha']:.3f}   tau {r['tau']:.2f} tokens/target call   c {r['c']:.3f} "
        f"(draft step {r['draft_step_s'] * 1e3:.0f} ms / target step {r['target_step_s'] * 1e3:.0f} ms)"
    )
    print(
        f"plain {r['plain_tok_s']:.2f} tok/s   speculative {r['speculative_tok_s']:.2f} "
        f"tok/s   speedup {r['speedup']:.2f}x   (Thm 3.8 predicts "
        f"{r['predicted_speedup']:.2f}x; optimal gamma {r['optimal_gamma']})"
    )
    verify = r["target_verify_s"]
    print(
        f"verify call (target scoring {r['verify_tokens']} tokens) {verify * 1e3:.0f} ms = "
        f"{verify / r['target_step_s']:.2f} target steps (Thm 3.8 assumes 1); with that cost the "
        f"model predicts {r['cost_model_speedup']:.2f}x"
    )
    compile_s, warmup_s = r["compile_s"], r["warmup_s"]
    print(
        f"compile (apart): plain {compile_s['plain']:.1f}s, speculative "
        f"{compile_s['speculative']:.1f}s; first runs, untimed (apart): plain "
        f"{warmup_s['plain']:.1f}s, speculative {warmup_s['speculative']:.1f}s"
    )


def draft_quantization(args: argparse.Namespace) -> precision.Route:
    """The draft's weight format for --draft_quantize ('none': the dtype; 'auto' resolved for this
    machine, `precision.resolve_draft_quantization`)."""
    requested = "" if args.draft_quantize == "none" else args.draft_quantize
    return precision.resolve_draft_quantization(requested)


def prompts(args: argparse.Namespace, vocabulary: Any) -> list[inputs.Example]:
    """The first --prompts HumanEval problems, or each --chat question as a user turn rendered
    through the chat template (the model's own unless --chat_template), tokenized as rendered."""
    if not args.chat:
        return inputs.read_examples("humaneval", limit=args.prompts)
    questions = [inputs.Example(i, q) for i, q in enumerate(args.chat)]
    return chat_inputs.render(
        questions, vocabulary, chat_inputs.template_for(vocabulary, args.chat_template)
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The demo for parsed command-line arguments (speculative/demo.py): loads, decodes, prints
    and writes args.out; returns what it wrote."""
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
    dtype = precision.resolve_dtype(args.dtype)
    try:  # a damaged download, an unreadable file, two vocabularies: one line (run_job)
        target, draft = load(args.target, dtype), load(args.draft, dtype)
        vocab.check_compatible(draft.vocabulary, target.vocabulary)
    except LOADER_ERRORS as e:
        raise JobError(" ".join(str(e).split()), role="demo") from e
    examples = prompts(args, target.vocabulary)
    draft = with_shortlist(draft, args.draft_shortlist, examples)
    quantize = draft_quantization(args)
    if quantize.dtype == "int8":  # half the draft's bytes (models/int8.py); exact
        params = int8.quantize_params(draft.params)
        draft = dataclasses.replace(draft, name=f"{draft.name}, int8", params=params)
    tree = tuple(int(w) for w in args.tree.split(",")) if args.tree else None
    spec = decoding.SpeculationSpec(None if tree else args.gamma, tree)
    config = decoding.DecodeConfig.from_spec(
        spec, args.max_decode_len, target.vocabulary.stop_ids, sampling
    )
    log.info(
        f"jax {jax.__version__} on {jax.devices()[0].platform}, {dtype}, batch {args.batch_size}, "
        f"{config.tree.describe() if tree else f'gamma {args.gamma}'}, {sampling}"
    )
    if args.staged:  # prompt lookup proposes the draft's tokens (drafts/staged.py)
        draft = dataclasses.replace(draft, model=staged.StagedDrafter(draft.model, args.staged))
    decoded = decode_prompts(target, draft, examples, config, args.batch_size, args.seed)
    # c and the verify cost, on a batch of the first prompt alone.
    probe = inputs.decoder_batch(inputs.tokenize(examples[:1], target.vocabulary, False))
    costs = timing.measure_c(
        target.model,
        target.params,
        draft.model,
        draft.params,
        probe,
        config.cache_length(target.model, probe),
        verify_lengths=[config.block],
        draft_config=config,  # a staged draft's step: its propose time per proposed token
    )
    result = result_json(args, config, decoded, costs, quantize)
    print_result(result)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    log.info(f"wrote {out}")
    return result
