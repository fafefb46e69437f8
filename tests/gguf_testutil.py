"""Writing small GGUF files for the loader and tokenizer tests, the way llama.cpp's converter does.

Weights start in Hugging Face (PyTorch) layout: linear weights [out, in]. GGUF keeps that array
order on disk (ggml lists the dimensions reversed); for `llama` the converter permutes the Q and K
rows of every head from rotate-half order to interleaved pairs, which `permute_rows` does here,
written independently of the loader's inverse.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType


def permute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's Q/K permutation: per head, [x0..x_{d/2-1}, y0..] -> [x0, y0, x1, y1, ...]."""
    d = w.shape[0] // heads
    return w.reshape(heads, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_to_gguf_tensors(
    state: Mapping[str, np.ndarray], arch: str, heads: int, kv_heads: int, num_layers: int
) -> dict[str, np.ndarray]:
    """HF LlamaForCausalLM / Qwen2ForCausalLM state dict (numpy) -> GGUF tensor name -> array."""
    out = {
        "token_embd.weight": state["model.embed_tokens.weight"],
        "output_norm.weight": state["model.norm.weight"],
    }
    if "lm_head.weight" in state:
        out["output.weight"] = state["lm_head.weight"]
    names = {
        "input_layernorm.weight": "attn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.q_proj.bias": "attn_q.bias",
        "self_attn.k_proj.bias": "attn_k.bias",
        "self_attn.v_proj.bias": "attn_v.bias",
        "self_attn.o_proj.weight": "attn_output.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    for i in range(num_layers):
        for hf, gg in names.items():
            key = f"model.layers.{i}.{hf}"
            if key not in state:
                continue
            w = state[key]
            if arch == "llama" and gg.startswith("attn_q"):
                w = permute_rows(w, heads)
            elif arch == "llama" and gg.startswith("attn_k"):
                w = permute_rows(w, kv_heads)
            out[f"blk.{i}.{gg}"] = w
    return out


def quantize(w: np.ndarray, qtype: Q) -> np.ndarray:
    """What the file stores for w: F32/F16 arrays, or the raw quantised bytes."""
    if qtype == Q.F32:
        return w.astype(np.float32)
    if qtype == Q.F16:
        return w.astype(np.float16)
    return gguf.quants.quantize(w.astype(np.float32), qtype)


def write_model(
    path: pathlib.Path,
    arch: str,
    hparams: Mapping[str, float],
    tensors: Mapping[str, np.ndarray],
    qtype: Q = Q.F32,
    raw: Mapping[str, tuple[np.ndarray, Q]] | None = None,
    tokenizer: Mapping | None = None,
) -> pathlib.Path:
    """Writes a GGUF model file.

    hparams: emb, layers, heads, kv_heads, mlp, context, rope_theta, eps (and optional head_dim).
    tensors: GGUF name -> float array; 2-D ones are stored as qtype, 1-D ones as F32 (as llama.cpp).
    raw: GGUF name -> (already quantised bytes, type), for types gguf-py cannot quantise.
    tokenizer: optional keyword arguments of `add_tokenizer`.
    """
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(int(hparams["layers"]))
    w.add_context_length(int(hparams["context"]))
    w.add_embedding_length(int(hparams["emb"]))
    w.add_feed_forward_length(int(hparams["mlp"]))
    w.add_head_count(int(hparams["heads"]))
    w.add_head_count_kv(int(hparams["kv_heads"]))
    w.add_rope_freq_base(float(hparams["rope_theta"]))
    w.add_layer_norm_rms_eps(float(hparams["eps"]))
    if "head_dim" in hparams:
        w.add_key_length(int(hparams["head_dim"]))
        w.add_value_length(int(hparams["head_dim"]))
    if tokenizer is not None:
        add_tokenizer(w, **tokenizer)
    for name, array in tensors.items():
        if array.ndim == 1:
            w.add_tensor(name, array.astype(np.float32))
        elif qtype in (Q.F32, Q.F16):
            w.add_tensor(name, quantize(array, qtype))
        else:
            w.add_tensor(name, quantize(array, qtype), raw_dtype=qtype)
    for name, (data, data_type) in (raw or {}).items():
        w.add_tensor(name, data, raw_dtype=data_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def add_tokenizer(
    w: gguf.GGUFWriter,
    tokens: Sequence[str],
    merges: Sequence[str],
    token_types: Sequence[int],
    pre: str,
    eos_id: int,
    bos_id: int | None = None,
    add_bos: bool = False,
    chat_template: str | None = None,
    model: str = "gpt2",
) -> None:
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(list(tokens))
    w.add_token_types(list(token_types))
    w.add_token_merges(list(merges))
    w.add_eos_token_id(eos_id)
    if bos_id is not None:
        w.add_bos_token_id(bos_id)
    w.add_add_bos_token(add_bos)
    if chat_template is not None:
        w.add_chat_template(chat_template)


def write_tokenizer_only(path: pathlib.Path, **tokenizer) -> pathlib.Path:
    """A GGUF file with tokenizer metadata and no tensors."""
    w = gguf.GGUFWriter(str(path), "llama")
    add_tokenizer(w, **tokenizer)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
