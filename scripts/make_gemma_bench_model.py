#!/usr/bin/env python3
"""Writes a GGUF with Gemma-3-270M's shapes and random weights, for speed comparisons only.

  scripts/make_gemma_bench_model.py OUT.gguf [--layers 18] [--window 512]

Architecture gemma3: 18 layers (every sixth global, the others sliding over the last 512
tokens), hidden 640, 4 query heads and 1 KV head of 256, MLP 2,048 (GeGLU), Q/K norms,
post-norms, rope_theta 1e6, tied embeddings over 262,144 tokens, Gemma 3's vocabulary size. No
Gemma tokenizer can be fetched here, so the vocabulary is SentencePiece-shaped filler: the 256
byte tokens, <pad>/<eos>/<bos>/<unk>, <start_of_turn>/<end_of_turn>, then "▁w<n>" pieces; text
tokenizes to about one token per byte, which is all a speed test needs (both engines see the
same tokens). Projections Q4_1 and the embedding / LM head Q8_0, as in the default SmolLM2
file. The weights are seeded noise: the output is gibberish, and it is not a test of
correctness. About 330 MB; numpy and gguf only. Used by docs/PERFORMANCE.md's Gemma-3-shaped
rows (bench/cpu_bench.py --model).
"""
import argparse
import os
import sys

from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_qwen_bench_model import random_tensors  # noqa: E402

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, CTX, VOCAB = 640, 4, 1, 256, 2048, 32768, 262144


def vocab():
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    types = [3, 3, 3, 2, 3, 3]  # control, unknown
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256  # byte
    while len(tokens) < VOCAB:
        tokens.append(f"\u2581w{len(tokens)}")
        types.append(1)
    scores = [0.0] * 262 + [-float(i) for i in range(VOCAB - 262)]
    return tokens, scores, types


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=18)
    ap.add_argument("--window", type=int, default=512)
    a = ap.parse_args()
    w = GGUFWriter(a.out, "gemma3")
    w.add_name("random Gemma-3-270M-shaped (speed only)")
    w.add_block_count(a.layers)
    w.add_context_length(CTX)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(a.window)
    tokens, scores, types = vocab()
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)

    rand, matrix = random_tensors(w)

    def norm(name, n):
        w.add_tensor(name, rand((n,), 0.1, 1.0))

    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    matrix("token_embd.weight", VOCAB, HIDDEN, T.Q8_0)
    for i in range(a.layers):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", HIDDEN)
        matrix(p + "attn_q.weight", q, HIDDEN)
        matrix(p + "attn_k.weight", kv, HIDDEN)
        matrix(p + "attn_v.weight", kv, HIDDEN)
        norm(p + "attn_q_norm.weight", HEAD_DIM)
        norm(p + "attn_k_norm.weight", HEAD_DIM)
        matrix(p + "attn_output.weight", HIDDEN, q)
        norm(p + "post_attention_norm.weight", HIDDEN)
        norm(p + "ffn_norm.weight", HIDDEN)
        matrix(p + "ffn_gate.weight", FFN, HIDDEN)
        matrix(p + "ffn_up.weight", FFN, HIDDEN)
        matrix(p + "ffn_down.weight", HIDDEN, FFN)
        norm(p + "post_ffw_norm.weight", HIDDEN)
    norm("output_norm.weight", HIDDEN)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{a.out}: {os.path.getsize(a.out) / 1e6:.0f} MB, vocab {VOCAB}, {a.layers} layers, "
          f"window {a.window}")


if __name__ == "__main__":
    main()
