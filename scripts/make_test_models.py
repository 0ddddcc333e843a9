#!/usr/bin/env python3
"""Writes small random models in Hugging Face format, for the loader and runner tests.

Usage:
  scripts/make_test_models.py [OUT_DIR] [--verify tests/golden/hf/manifest.json]

OUT_DIR defaults to $TINYSERVE_CACHE/test-models, else build/test-models. Needs only numpy
(CI has no torch); the safetensors files are written by hand.

Models (one folder each, with config.json, tokenizer.json and tokenizer_config.json):
  llama-tiny            llama, hidden 64, 2 layers, 4 heads, 2 KV heads (GQA), head_dim 16,
                        SwiGLU 96, vocab 272, F32, one model.safetensors, separate lm_head.
  llama-tiny-sharded    the same tensors as llama-tiny split over two files with a
                        model.safetensors.index.json; also holds a rotary_emb.inv_freq buffer
                        (older checkpoints did) that loaders must skip.
  llama-tiny-tied-bf16  other weights, BF16, tie_word_embeddings (no lm_head.weight).
  qwen2-tiny            qwen2 (Qwen2ForCausalLM): llama-tiny's shapes with Q/K/V biases, rope_theta
                        1e6, linear RoPE scaling (factor 2), tied embeddings, F32.
  qwen3-tiny            qwen3 (Qwen3ForCausalLM): per-head Q/K RMSNorms, head_dim 32 (4 heads of
                        32 over hidden 64), no biases, tied embeddings, F32.
  qwen3-tiny-yarn       qwen3-tiny's shapes (other weights) with rope_scaling "yarn" (factor 4 over an
                        original context of 16, as Qwen3's model card sets it for 128K: the pairs
                        fall on both sides of the ramp and one on it; attention factor 1.139), and
                        the NFC normalizer in its tokenizer.json, as Qwen's have it.
  gemma3-tiny           gemma3_text (Gemma3ForCausalLM), 3 layers: sliding (window 8), full,
                        sliding; heads of 32 over hidden 64, Q/K norms, post-norms, GeGLU,
                        query_pre_attn_scalar 24, rope_theta 1e6 with linear scaling (factor 2,
                        the full layer only) and rope_local_base_freq 1e4, tied embeddings, F32;
                        the config in the style of the Hub's gemma-3-270m (transformers 4.5x).
  llama-tiny-rope3-bias llama with rope_scaling "llama3" (original context 32, factor 8) and
                        attention_bias (Q/K/V/O biases), F32.
  gpt2-tiny             gpt2, n_embd 64, 2 layers, 4 heads, n_positions 128, F32, names without
                        the "transformer." prefix (as the Hub's gpt2), with the attn.bias and
                        attn.masked_bias buffers; Conv1D weights stored [in, out].
  gpt2-tiny-lmhead-f16  the gpt2-tiny weights in F16, saved as GPT2LMHeadModel does:
                        "transformer." prefix plus lm_head.weight (a copy of wte).

Determinism: weights come from numpy's PCG64 raw 64-bit stream (stable across numpy
versions), mapped to uniform floats with the wanted standard deviation. The output is
byte-for-byte reproducible; files whose content already matches are not rewritten.
--verify compares the sha256 of every written safetensors file against the manifest that
scripts/make_hf_goldens.py recorded, and fails if the generator drifted from the goldens.
"""

import argparse
import hashlib
import json
import math
import os
import struct
import sys

import numpy as np

# ----------------------------------------------------------------------------------------------
# Tokenizer: byte-level BPE with 256 byte tokens, a few merges and <|endoftext|>.

MERGES = [
    ("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("o", "n"),
    ("Ġ", "s"), ("r", "e"), ("a", "t"), ("e", "n"), ("Ġ", "w"), ("o", "r"), ("i", "s"),
    ("Ġ", "o"),
]
EOT = "<|endoftext|>"


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable character map."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) +
          list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def make_vocab():
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}  # id = byte value
    for a, b in MERGES:
        assert a in vocab and b in vocab, (a, b)
        vocab[a + b] = len(vocab)
    vocab[EOT] = len(vocab)
    return vocab


VOCAB = make_vocab()
VOCAB_SIZE = len(VOCAB)  # 272
EOT_ID = VOCAB[EOT]      # 271


def tokenizer_json(normalizer=None):
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{
            "id": EOT_ID, "content": EOT, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": False, "special": True,
        }],
        "normalizer": normalizer,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": False,
            "vocab": VOCAB,
            "merges": [f"{a} {b}" for a, b in MERGES],
        },
    }
    return json.dumps(doc, ensure_ascii=False, indent=1).encode("utf-8") + b"\n"


def tokenizer_config_json():
    doc = {
        "tokenizer_class": "GPT2Tokenizer", "bos_token": EOT, "eos_token": EOT,
        "unk_token": EOT, "add_bos_token": False, "model_max_length": 128,
        "clean_up_tokenization_spaces": False,
    }
    return json.dumps(doc, indent=1).encode("utf-8") + b"\n"


# ----------------------------------------------------------------------------------------------
# Deterministic weights.

class Rng:
    """Uniform floats from PCG64's raw stream: (u >> 11) * 2^-53 is exact and version-stable."""

    def __init__(self, seed):
        self.bg = np.random.PCG64(seed)

    def uniform(self, shape, std, mean=0.0):
        n = int(np.prod(shape))
        raw = self.bg.random_raw(n)
        u = (raw >> np.uint64(11)).astype(np.float64) * (2.0 ** -53)  # [0, 1)
        x = mean + (u * 2.0 - 1.0) * (std * np.sqrt(3.0))  # uniform with this std
        return x.astype(np.float32).reshape(shape)


def inv_sqrt(n):
    """1 / sqrt(n): both operations correctly rounded, so the same on every platform."""
    return 1.0 / math.sqrt(n)


def to_bf16_bits(x):
    """float32 -> bfloat16 bits, round to nearest even (no NaNs here)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    u = u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    return (u >> np.uint32(16)).astype(np.uint16)


# ----------------------------------------------------------------------------------------------
# safetensors writer.

def safetensors_bytes(tensors, dtype):
    """tensors: list of (name, float32 array). dtype: "F32", "F16" or "BF16" for every tensor."""
    header = {}
    blobs = []
    offset = 0
    for name, arr in tensors:
        if dtype == "F32":
            raw = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        elif dtype == "F16":
            raw = np.ascontiguousarray(arr, dtype="<f2").tobytes()
        elif dtype == "BF16":
            raw = to_bf16_bits(arr).astype("<u2").tobytes()
        else:
            raise ValueError(dtype)
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)  # pad so the data starts 8-byte aligned
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


# ----------------------------------------------------------------------------------------------
# Models.

LLAMA = dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=96, ctx=128)
GPT2 = dict(hidden=64, layers=2, heads=4, ctx=128)


def llama_tensors(seed, tied, head_dim=None, qk_norm=False, layers=None, gemma=False):
    c = LLAMA
    rng = Rng(seed)
    d, hd, f = c["hidden"], head_dim or c["head_dim"], c["ffn"]
    t = [("model.embed_tokens.weight", rng.uniform((VOCAB_SIZE, d), 1.0))]
    for i in range(layers or c["layers"]):
        p = f"model.layers.{i}."
        t += [
            (p + "input_layernorm.weight", rng.uniform((d,), 0.1, 1.0)),
            (p + "self_attn.q_proj.weight", rng.uniform((c["heads"] * hd, d), inv_sqrt(d))),
            (p + "self_attn.k_proj.weight", rng.uniform((c["kv_heads"] * hd, d), inv_sqrt(d))),
            (p + "self_attn.v_proj.weight", rng.uniform((c["kv_heads"] * hd, d), inv_sqrt(d))),
            (p + "self_attn.o_proj.weight",
             rng.uniform((d, c["heads"] * hd), inv_sqrt(c["heads"] * hd))),
            (p + "post_attention_layernorm.weight", rng.uniform((d,), 0.1, 1.0)),
            (p + "mlp.gate_proj.weight", rng.uniform((f, d), inv_sqrt(d))),
            (p + "mlp.up_proj.weight", rng.uniform((f, d), inv_sqrt(d))),
            (p + "mlp.down_proj.weight", rng.uniform((d, f), inv_sqrt(f))),
        ]
        if qk_norm:
            t += [(p + "self_attn.q_norm.weight", rng.uniform((hd,), 0.5, 1.5)),
                  (p + "self_attn.k_norm.weight", rng.uniform((hd,), 0.5, 1.5))]
        if gemma:  # Gemma's norms scale by 1 + w
            t += [(p + "pre_feedforward_layernorm.weight", rng.uniform((d,), 0.3)),
                  (p + "post_feedforward_layernorm.weight", rng.uniform((d,), 0.3))]
    t.append(("model.norm.weight", rng.uniform((d,), 0.1, 1.0)))
    if not tied:
        t.append(("lm_head.weight", rng.uniform((VOCAB_SIZE, d), inv_sqrt(d))))
    return t


def attention_biases(seed, with_o):
    """Q/K/V (and O) projection biases for every layer (Qwen2; Llama with attention_bias)."""
    c = LLAMA
    rng = Rng(seed)
    q, kv = c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
    t = []
    for i in range(c["layers"]):
        p = f"model.layers.{i}.self_attn."
        t += [(p + "q_proj.bias", rng.uniform((q,), 0.5)),
              (p + "k_proj.bias", rng.uniform((kv,), 1.0)),
              (p + "v_proj.bias", rng.uniform((kv,), 0.2))]
        if with_o:
            t.append((p + "o_proj.bias", rng.uniform((c["hidden"],), 0.2)))
    return t


def qwen_config(model_type):
    c = LLAMA
    return {
        "architectures": [model_type.capitalize() + "ForCausalLM"], "model_type": model_type,
        "hidden_size": c["hidden"], "num_hidden_layers": c["layers"],
        "num_attention_heads": c["heads"], "num_key_value_heads": c["kv_heads"],
        "intermediate_size": c["ffn"], "hidden_act": "silu", "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": c["ctx"], "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "use_sliding_window": False,
        "sliding_window": None, "max_window_layers": c["layers"], "tie_word_embeddings": True,
        "bos_token_id": EOT_ID, "eos_token_id": EOT_ID, "initializer_range": 0.02,
        "attention_dropout": 0.0, "torch_dtype": "float32",
    }


def gemma3_config():
    c = LLAMA
    return {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
        "hidden_size": c["hidden"], "num_hidden_layers": 3, "num_attention_heads": c["heads"],
        "num_key_value_heads": c["kv_heads"], "head_dim": 32, "intermediate_size": c["ffn"],
        "hidden_activation": "gelu_pytorch_tanh", "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": c["ctx"], "rms_norm_eps": 1e-6,
        "query_pre_attn_scalar": 24, "sliding_window": 8, "_sliding_window_pattern": 2,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        "attn_logit_softcapping": None, "final_logit_softcapping": None,
        "attention_bias": False, "attention_dropout": 0.0, "use_bidirectional_attention": False,
        "bos_token_id": EOT_ID, "eos_token_id": EOT_ID, "pad_token_id": EOT_ID,
        "initializer_range": 0.02, "torch_dtype": "float32",
    }


def llama_config(tied, dtype):
    c = LLAMA
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": c["hidden"], "num_hidden_layers": c["layers"],
        "num_attention_heads": c["heads"], "num_key_value_heads": c["kv_heads"],
        "head_dim": c["head_dim"], "intermediate_size": c["ffn"], "hidden_act": "silu",
        "vocab_size": VOCAB_SIZE, "max_position_embeddings": c["ctx"], "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "rope_scaling": None, "attention_bias": False,
        "mlp_bias": False, "tie_word_embeddings": tied, "bos_token_id": EOT_ID,
        "eos_token_id": EOT_ID, "initializer_range": 0.02, "torch_dtype": dtype,
    }


def gpt2_tensors(seed, prefix, with_buffers, with_lm_head):
    c = GPT2
    rng = Rng(seed)
    d, n = c["hidden"], c["ctx"]
    t = [("wte.weight", rng.uniform((VOCAB_SIZE, d), 0.5)),
         ("wpe.weight", rng.uniform((n, d), 0.5))]
    for i in range(c["layers"]):
        p = f"h.{i}."
        t += [
            (p + "ln_1.weight", rng.uniform((d,), 0.1, 1.0)),
            (p + "ln_1.bias", rng.uniform((d,), 0.1)),
            (p + "attn.c_attn.weight", rng.uniform((d, 3 * d), inv_sqrt(d))),  # Conv1D [in, out]
            (p + "attn.c_attn.bias", rng.uniform((3 * d,), 0.1)),
            (p + "attn.c_proj.weight", rng.uniform((d, d), inv_sqrt(d))),
            (p + "attn.c_proj.bias", rng.uniform((d,), 0.1)),
            (p + "ln_2.weight", rng.uniform((d,), 0.1, 1.0)),
            (p + "ln_2.bias", rng.uniform((d,), 0.1)),
            (p + "mlp.c_fc.weight", rng.uniform((d, 4 * d), inv_sqrt(d))),
            (p + "mlp.c_fc.bias", rng.uniform((4 * d,), 0.1)),
            (p + "mlp.c_proj.weight", rng.uniform((4 * d, d), inv_sqrt(4 * d))),
            (p + "mlp.c_proj.bias", rng.uniform((d,), 0.1)),
        ]
        if with_buffers:
            t += [(p + "attn.bias", np.tril(np.ones((n, n), np.float32)).reshape(1, 1, n, n)),
                  (p + "attn.masked_bias", np.array(-1e4, np.float32))]
    t += [("ln_f.weight", rng.uniform((d,), 0.1, 1.0)), ("ln_f.bias", rng.uniform((d,), 0.1))]
    t = [(prefix + name, arr) for name, arr in t]
    if with_lm_head:
        t.append(("lm_head.weight", t[0][1].copy()))
    return t


def gpt2_config(dtype):
    c = GPT2
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "n_embd": c["hidden"], "n_layer": c["layers"], "n_head": c["heads"], "n_inner": None,
        "n_positions": c["ctx"], "n_ctx": c["ctx"], "vocab_size": VOCAB_SIZE,
        "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False, "tie_word_embeddings": True,
        "bos_token_id": EOT_ID, "eos_token_id": EOT_ID, "initializer_range": 0.02,
        "torch_dtype": dtype,
    }


def json_bytes(doc):
    return json.dumps(doc, indent=2).encode("utf-8") + b"\n"


def sharded(tensors, dtype, n_shards):
    """Splits tensors in order over n_shards files; returns {file: bytes} including the index."""
    files = {}
    weight_map = {}
    per = (len(tensors) + n_shards - 1) // n_shards
    total = 0
    for s in range(n_shards):
        name = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        part = tensors[s * per:(s + 1) * per]
        files[name] = safetensors_bytes(part, dtype)
        for tname, arr in part:
            weight_map[tname] = name
            total += arr.size * (4 if dtype == "F32" else 2)
    files["model.safetensors.index.json"] = json_bytes(
        {"metadata": {"total_size": total}, "weight_map": weight_map})
    return files


def all_models():
    """{model name: {file name: bytes}}."""
    common = {"tokenizer.json": tokenizer_json(), "tokenizer_config.json": tokenizer_config_json()}
    models = {}

    llama = llama_tensors(seed=1, tied=False)
    models["llama-tiny"] = {"config.json": json_bytes(llama_config(False, "float32")),
                            "model.safetensors": safetensors_bytes(llama, "F32"), **common}

    # Python float pow (not numpy's float32 SIMD power) keeps the bytes platform-independent.
    inv_freq = ("model.layers.0.self_attn.rotary_emb.inv_freq",
                np.array([10000.0 ** (-i / 16) for i in range(0, 16, 2)], dtype=np.float32))
    models["llama-tiny-sharded"] = {"config.json": json_bytes(llama_config(False, "float32")),
                                    **sharded(llama + [inv_freq], "F32", 2), **common}

    models["llama-tiny-tied-bf16"] = {
        "config.json": json_bytes(llama_config(True, "bfloat16")),
        "model.safetensors": safetensors_bytes(llama_tensors(seed=2, tied=True), "BF16"),
        **common}

    # Qwen2: Q/K/V biases, theta 1e6, linear RoPE scaling, tied embeddings.
    models["qwen2-tiny"] = {
        "config.json": json_bytes(qwen_config("qwen2")),
        "model.safetensors": safetensors_bytes(
            llama_tensors(seed=4, tied=True) + attention_biases(seed=5, with_o=False), "F32"),
        **common}

    # Qwen3: per-head Q/K RMSNorms, heads of 32 over a hidden size of 64 (Qwen3-0.6B's 128 over
    # 1,024), no biases.
    qwen3 = qwen_config("qwen3")
    qwen3.update({"head_dim": 32, "attention_bias": False, "rope_scaling": None})
    models["qwen3-tiny"] = {
        "config.json": json_bytes(qwen3),
        "model.safetensors": safetensors_bytes(
            llama_tensors(seed=8, tied=True, head_dim=32, qk_norm=True), "F32"),
        **common}

    # Qwen3 with YaRN: the 17- and 40-token sequences run past the original context of 16.
    qwen3_yarn = dict(qwen3)
    qwen3_yarn["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0,
                                  "original_max_position_embeddings": 16}
    models["qwen3-tiny-yarn"] = {
        "config.json": json_bytes(qwen3_yarn),
        "model.safetensors": safetensors_bytes(
            llama_tensors(seed=10, tied=True, head_dim=32, qk_norm=True), "F32"),
        **common,
        "tokenizer.json": tokenizer_json(normalizer={"type": "NFC"})}  # as Qwen's tokenizer.json

    # Gemma 3: a window of 8 that the 17- and 40-token sequences cross (mid-page), one full
    # layer between two sliding ones.
    models["gemma3-tiny"] = {
        "config.json": json_bytes(gemma3_config()),
        "model.safetensors": safetensors_bytes(
            llama_tensors(seed=9, tied=True, head_dim=32, qk_norm=True, layers=3, gemma=True),
            "F32"),
        **common}

    # Llama 3's RoPE (rope_scaling llama3 over an original context of 32: with head_dim 16 the
    # pairs fall on all three sides, kept, interpolated, divided by 8) and attention_bias.
    rope3 = llama_config(False, "float32")
    rope3["attention_bias"] = True
    rope3["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    models["llama-tiny-rope3-bias"] = {
        "config.json": json_bytes(rope3),
        "model.safetensors": safetensors_bytes(
            llama_tensors(seed=6, tied=False) + attention_biases(seed=7, with_o=True), "F32"),
        **common}

    models["gpt2-tiny"] = {
        "config.json": json_bytes(gpt2_config("float32")),
        "model.safetensors": safetensors_bytes(
            gpt2_tensors(seed=3, prefix="", with_buffers=True, with_lm_head=False), "F32"),
        **common}

    models["gpt2-tiny-lmhead-f16"] = {
        "config.json": json_bytes(gpt2_config("float16")),
        "model.safetensors": safetensors_bytes(
            gpt2_tensors(seed=3, prefix="transformer.", with_buffers=False, with_lm_head=True),
            "F16"),
        **common}
    return models


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def write_models(out_dir):
    """Writes every file whose content differs; returns {model: {file: sha256}}."""
    hashes = {}
    written = 0
    for model, files in all_models().items():
        mdir = os.path.join(out_dir, model)
        os.makedirs(mdir, exist_ok=True)
        hashes[model] = {}
        for fname, data in files.items():
            path = os.path.join(mdir, fname)
            digest = sha256(data)
            hashes[model][fname] = digest
            if os.path.exists(path):
                with open(path, "rb") as fh:
                    if sha256(fh.read()) == digest:
                        continue
            tmp = path + ".tmp"
            with open(tmp, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
            written += 1
    return hashes, written


def default_out_dir():
    cache = os.environ.get("TINYSERVE_CACHE")
    if cache:
        return os.path.join(cache, "test-models")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(root, "build", "test-models")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir", nargs="?", default=default_out_dir())
    ap.add_argument("--verify", metavar="MANIFEST",
                    help="fail unless the safetensors hashes match this golden manifest")
    args = ap.parse_args()

    hashes, written = write_models(args.out_dir)
    print(f"make_test_models: {len(hashes)} models in {args.out_dir} ({written} files written)")

    if args.verify:
        with open(args.verify, encoding="utf-8") as fh:
            manifest = json.load(fh)
        bad = []
        for model, entry in manifest["models"].items():
            for fname, digest in entry["files_sha256"].items():
                got = hashes.get(model, {}).get(fname)
                if got != digest:
                    bad.append(f"{model}/{fname}: manifest {digest}, generated {got}")
        if bad:
            print("make_test_models: the generator drifted from the goldens in " + args.verify +
                  " (rerun scripts/make_hf_goldens.py):\n  " + "\n  ".join(bad), file=sys.stderr)
            return 1
        print(f"make_test_models: hashes match {args.verify}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
