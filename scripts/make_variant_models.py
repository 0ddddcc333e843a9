#!/usr/bin/env python3
"""Writes SmolLM2-135M-Instruct rewritten as the Llama variants TinyServe reads, so that each can
be checked against llama.cpp on real weights:

  qwen2        general.architecture "qwen2" (every llama.* key renamed qwen2.*): attn_q and attn_k
               rows put back in Hugging Face order (llama.cpp's converter permutes them for
               "llama" only; qwen2 runs NEOX, rotate-half, RoPE), Q/K/V biases added (seeded,
               std 0.05 / 0.1 / 0.02: small enough that the model still answers), and
               tokenizer.ggml.pre "qwen2". The source model's function up to the biases.
  qwen3        as qwen2 but "qwen3": no biases, per-head Q/K RMSNorms instead (attn_q_norm and
               attn_k_norm weights, seeded uniform 1-1.5; the model, off its training, still writes
               words but meets near ties after 2 greedy tokens).
  gemma3       general.architecture "gemma3": attn_q / attn_k rows in Hugging Face order (NEOX
               RoPE), per-head Q/K RMSNorms (seeded uniform 1-1.5), post_attention_norm and
               post_ffw_norm (seeded uniform POST_NORM), GeGLU instead of SwiGLU, every sixth
               layer global and the others sliding over gemma3.attention.sliding_window = 20
               tokens (so the texts and greedy runs cross it, mid-page). Gemma scales the
               embeddings by sqrt(576) = 24: token_embd's Q8_0 block scales are divided by 24
               (fp16) and the LM head keeps the source's rows as output.weight.
  qwen2-yarn   the qwen2 variant with YaRN RoPE scaling as llama.cpp's converter writes it for
               Qwen2.5 (rope.scaling.type "yarn", factor 4, original_context_length YARN_CTX = 32
               so that the texts run past it; the ramp then spans channel pairs 0-5 of SmolLM2's
               heads of 64 at base 1e5).
  llama3-rope  "llama" with a rope_freqs.weight tensor (Llama 3's per-frequency divisors; here a
               seeded uniform 1-1.25 on every channel pair, so short prompts feel them too),
               rope.scaling.type "linear" with factor 1.1, and tokenizer.ggml.pre "llama-bpe".

Usage:
  scripts/make_variant_models.py SOURCE.gguf OUT.gguf VARIANT     write one (numpy and gguf only)
  scripts/make_variant_models.py --goldens [SOURCE.gguf] [VARIANT ...]   dev-time: llama.cpp's
        outputs on the variants (all, or those named, kept beside the others) into tests/golden/smollm2/variants.json (needs llama-cpp-python): what
        scripts/make_lora_goldens.run records, as for the K-quant goldens, and the ids of
        make_tokenizer_goldens.COMMON_CASES under each variant's pre-tokenizer

Quantized tensors are copied byte for byte (row permutations move whole rows), so the output
is byte-for-byte the same on any machine; tests/cluster/variant_test.py checks its sha256
against the golden before comparing.
"""
import json
import os
import sys
import tempfile

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_lora_adapter import sha256  # noqa: E402,F401  (tests call make_variant_models.sha256)

VARIANTS = ("qwen2", "qwen3", "llama3-rope", "gemma3", "qwen2-yarn")
YARN_CTX = 32
GEMMA_WINDOW = 20
POST_NORM = (0.05, 0.15)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "golden", "smollm2", "variants.json")


def uniform(seed, n, lo, hi):
    """Deterministic on any numpy: PCG64's raw 64-bit stream mapped to [lo, hi)."""
    raw = np.random.Generator(np.random.PCG64(seed)).bit_generator.random_raw(n)
    return (lo + (hi - lo) * (raw >> np.uint64(11)).astype(np.float64) / 2.0**53).astype(
        np.float32)


def normal(seed, n, std):
    # Sum of 12 uniforms minus 6: close enough to a normal, and exactly reproducible.
    u = uniform(seed, 12 * n, 0.0, 1.0).astype(np.float64).reshape(n, 12)
    return ((u.sum(axis=1) - 6.0) * std).astype(np.float32)


def unpermute_rows(data, n_rows, n_head):
    """Inverse of llama.cpp's Q/K row permutation (convert_hf_to_gguf's LlamaModel.permute)."""
    rows = data.reshape(n_rows, -1)
    hd = n_rows // n_head
    rows = rows.reshape(n_head, hd // 2, 2, -1).swapaxes(1, 2).reshape(n_rows, -1)
    return np.ascontiguousarray(rows).reshape(-1)


def add_raw(w, name, data, shape, qtype):
    if qtype == GGMLQuantizationType.F32:
        w.add_tensor(name, data.view(np.float32).reshape(list(reversed(shape))))
    else:  # quantized: rows of bytes, from which gguf derives the shape
        w.add_tensor(name, data.reshape(int(np.prod(shape[1:])), -1), raw_dtype=qtype)


def scale_q8_0(data, factor):
    """A Q8_0 tensor's values times factor: each 34-byte block's fp16 scale."""
    blocks = data.reshape(-1, 34).copy()
    d = blocks[:, :2].view(np.float16).astype(np.float32) * np.float32(factor)
    blocks[:, :2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return blocks.reshape(-1)


def write(source, out, variant):
    if variant not in VARIANTS:
        sys.exit(f"unknown variant {variant!r} (one of {', '.join(VARIANTS)})")
    yarn = variant.endswith("-yarn")
    variant = variant.removesuffix("-yarn")  # the weights are the base variant's
    r = GGUFReader(source)
    src_arch = r.fields["general.architecture"].contents()
    arch = variant if variant.startswith(("qwen", "gemma")) else src_arch
    n_head = r.fields[f"{src_arch}.attention.head_count"].contents()
    n_kv = r.fields[f"{src_arch}.attention.head_count_kv"].contents()
    head_dim = r.fields[f"{src_arch}.embedding_length"].contents() // n_head
    n_layers = r.fields[f"{src_arch}.block_count"].contents()

    w = GGUFWriter(out, arch)  # writes general.architecture
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        if key == "tokenizer.ggml.pre" and variant != "gemma3":
            value = "qwen2" if variant.startswith("qwen") else "llama-bpe"
        if key.startswith(src_arch + "."):
            key = arch + key[len(src_arch):]
        sub = field.types[1] if field.types[0] == GGUFValueType.ARRAY else None
        w.add_key_value(key, value, field.types[0], sub_type=sub)
    if variant == "gemma3":
        w.add_key_value(f"{arch}.attention.sliding_window", GEMMA_WINDOW, GGUFValueType.UINT32)
    if yarn:
        w.add_key_value(f"{arch}.rope.scaling.type", "yarn", GGUFValueType.STRING)
        w.add_key_value(f"{arch}.rope.scaling.factor", 4.0, GGUFValueType.FLOAT32)
        w.add_key_value(f"{arch}.rope.scaling.original_context_length", YARN_CTX,
                        GGUFValueType.UINT32)
    if variant == "llama3-rope":
        w.add_key_value(f"{arch}.rope.scaling.type", "linear", GGUFValueType.STRING)
        w.add_key_value(f"{arch}.rope.scaling.factor", 1.1, GGUFValueType.FLOAT32)

    for t in r.tensors:
        data = np.array(t.data, copy=True).reshape(-1).view(np.uint8)
        shape = [int(v) for v in t.shape]
        if arch != src_arch and t.name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = n_head if t.name.endswith("attn_q.weight") else n_kv
            data = unpermute_rows(data, shape[1], heads)
        qtype = GGMLQuantizationType(int(t.tensor_type))
        if variant == "gemma3" and t.name == "token_embd.weight":
            add_raw(w, "output.weight", data, shape, qtype)
            assert qtype == GGMLQuantizationType.Q8_0, qtype
            data = scale_q8_0(data, 1.0 / 24.0)
        add_raw(w, t.name, data, shape, qtype)
    if variant == "qwen2":

        for layer in range(n_layers):
            for i, (proj, rows, std) in enumerate((("q", n_head * head_dim, 0.05),
                                                    ("k", n_kv * head_dim, 0.1),
                                                    ("v", n_kv * head_dim, 0.02))):
                w.add_tensor(f"blk.{layer}.attn_{proj}.bias", normal(100 * layer + i, rows, std))
    elif variant == "qwen3":
        for layer in range(n_layers):
            for i, norm in enumerate(("attn_q_norm", "attn_k_norm")):
                w.add_tensor(f"blk.{layer}.{norm}.weight",
                             uniform(200 + 10 * layer + i, head_dim, 1.0, 1.5))
    elif variant == "gemma3":
        for layer in range(n_layers):
            for i, norm in enumerate(("attn_q_norm", "attn_k_norm")):
                w.add_tensor(f"blk.{layer}.{norm}.weight",
                             uniform(300 + 10 * layer + i, head_dim, 1.0, 1.5))
            for i, norm in enumerate(("post_attention_norm", "post_ffw_norm")):
                w.add_tensor(f"blk.{layer}.{norm}.weight",
                             uniform(400 + 10 * layer + i, n_head * head_dim, *POST_NORM))
    else:
        w.add_tensor("rope_freqs.weight", uniform(7, head_dim // 2, 1.0, 1.25))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def goldens(source, only=()):
    import llama_cpp
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import make_lora_goldens
    import make_tokenizer_goldens
    out = {"generator": "scripts/make_variant_models.py --goldens",
           "llama_cpp_python": llama_cpp.__version__, "source_sha256": sha256(source),
           "variants": {}}
    if only:  # keep the other variants' outputs as they are
        with open(GOLDEN, encoding="utf-8") as f:
            out["variants"] = json.load(f)["variants"]
    with tempfile.TemporaryDirectory() as tmp:
        for variant in only or VARIANTS:
            path = os.path.join(tmp, variant + ".gguf")
            write(source, path, variant)
            vocab = llama_cpp.Llama(path, vocab_only=True, verbose=False)
            tokenize = [{"text": t, "ids": vocab.tokenize(t.encode("utf-8"), add_bos=False,
                                                          special=False)}
                        for t in make_tokenizer_goldens.COMMON_CASES if t]
            out["variants"][variant] = {"model_sha256": sha256(path),
                                        "outputs": make_lora_goldens.run(None, path),
                                        "tokenize": tokenize}
            print(variant, [g["text"][:60] for g in out["variants"][variant]["outputs"]["greedy"]])
    with open(GOLDEN, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=0)
        f.write("\n")


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--goldens":
        goldens(sys.argv[2] if len(sys.argv) > 2 else os.path.expanduser(
            "~/.cache/tinyserve/SmolLM2-135M-Instruct.Q4_1.gguf"), tuple(sys.argv[3:]))
        return
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    write(*sys.argv[1:])
    print(f"{sys.argv[2]}: sha256 {sha256(sys.argv[2])}")


if __name__ == "__main__":
    main()
