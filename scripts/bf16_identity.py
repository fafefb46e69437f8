#!/usr/bin/env python
"""Greedy identity of bfloat16 speculative decoding with bfloat16 plain decoding on real weights,
and where it breaks: for each prompt, the first token at which the two outputs differ, and the
target's two best logits there, teacher-forced over the prompt and plain's tokens before it.

Qwen2.5-Coder 1.5B target, 0.5B draft with its 32,768-id shortlist head, both bfloat16, gamma 5,
up to 128 new tokens, batch 1, through `decoding.autoregressive_decode` and
`decoding.speculative_decode` (no job around them).

    .venv/bin/python scripts/bf16_identity.py 0,1,2,3,4,5,6,7,8,9
    .venv/bin/python scripts/bf16_identity.py 100,101,102,103 --tree 2,1,1,1,1,1
"""

import argparse

import jax.numpy as jnp
import numpy as np

from speculative import checkpoints, decoding, vocab
from speculative.data import inputs
from speculative.drafts import shortlist
from speculative.loading import fetch
from speculative.models import decoder


def main(indices: list[int], tree: tuple[int, ...] | None = None) -> None:
    path = fetch.ensure_model("qwen2.5-coder-1.5b")
    cfg, params = checkpoints.load_gguf(path, dtype=jnp.bfloat16)
    target = decoder.DecoderLM(cfg)
    dcfg, dparams = checkpoints.load_gguf(
        fetch.ensure_model("qwen2.5-coder-0.5b"), dtype=jnp.bfloat16
    )
    v = vocab.from_gguf(path)
    ids = inputs.tokenize(
        inputs.read_examples("humaneval", limit=max(indices) + 1), v, encoder_decoder=False
    )
    short = shortlist.for_prompts(v, 32768, ids, vocab_size=dcfg.vocab_size)
    dcfg, dparams = decoder.restrict_head(dcfg, dparams, short)
    draft = decoder.DecoderLM(dcfg)
    for i in indices:
        batch = inputs.decoder_batch([ids[i]], pad_to=max(128, len(ids[i])))
        plain = decoding.autoregressive_decode(
            target, params, batch, max_decode_len=128, eos_id=v.stop_ids
        )
        spec = decoding.speculative_decode(
            target,
            params,
            draft,
            dparams,
            batch,
            gamma=None if tree else 5,
            tree=tree,
            max_decode_len=128,
            eos_id=v.stop_ids,
        )
        a, b = np.asarray(plain.tokens[0]), np.asarray(spec.tokens[0])
        diff = np.nonzero(a != b)[0]
        where = (
            "identical"
            if diff.size == 0
            else (f"first diff at {diff[0]}: plain {a[diff[0]]} spec {b[diff[0]]}")
        )
        print(i, where, "len", int(plain.lengths[0]), int(spec.lengths[0]), flush=True)
        if diff.size:  # teacher-forced target logits over prompt + plain tokens: the gap there
            seq = list(ids[i]) + a[: diff[0]].tolist()
            tokens = jnp.asarray([seq], jnp.int32)
            state = target.init_state(params, {"prompt": tokens}, len(seq) + 8)
            logits, _ = target.extend(params, state, tokens)
            last = np.asarray(logits[0, -1])
            top = np.argsort(last)[::-1][:2]
            print("  teacher-forced top2", top, last[top], "gap", last[top[0]] - last[top[1]])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompts", help="HumanEval indices, comma-separated")
    parser.add_argument("--tree", help="verify this tree's widths (e.g. 2,1,1,1,1,1), not gamma 5")
    args = parser.parse_args()
    widths = tuple(int(w) for w in args.tree.split(",")) if args.tree else None
    main([int(x) for x in args.prompts.split(",")], widths)
