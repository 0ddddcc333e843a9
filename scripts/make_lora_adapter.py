#!/usr/bin/env python3
"""Writes a random LoRA adapter for a GGUF llama model, in llama.cpp's adapter format (what
convert_lora_to_gguf.py writes): general.type "adapter", adapter.type "lora",
adapter.lora.alpha, and per adapted weight `<name>.lora_a` (ne [in, r]) and `<name>.lora_b`
(ne [r, out]), F32.

Usage:
  scripts/make_lora_adapter.py MODEL.gguf OUT.gguf --preset NAME

Presets (rank, alpha, which projections of every layer, seed):
  all-r8   r 8,  alpha 16: attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down
  attn-r4  r 4,  alpha 4:  attn_q, attn_v (the PEFT default target_modules)

Determinism: values come from numpy's PCG64 raw 64-bit stream (stable across numpy versions)
mapped to uniform floats; the file is byte-for-byte reproducible (tests check its sha256
against the golden, scripts/make_lora_goldens.py). Needs numpy and gguf (the CI venv has both).
"""
import argparse
import hashlib
import os
import sys

import gguf
import numpy as np

PRESETS = {
    "all-r8": dict(rank=8, alpha=16.0, seed=8,
                   targets=["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                            "ffn_down"]),
    "attn-r4": dict(rank=4, alpha=4.0, seed=4, targets=["attn_q", "attn_v"]),
}
# Size of the update relative to a unit-variance product: large enough that greedy outputs
# change within a few tokens, small enough that the model still writes words.
STRENGTH = 0.35


def uniform(rng, n, std):
    """n floats uniform with standard deviation std, from the raw 64-bit stream."""
    raw = rng.bit_generator.random_raw(n)
    u = (raw >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)  # [0, 1)
    return ((u * 2.0 - 1.0) * (std * np.sqrt(3.0))).astype(np.float32)


def model_shapes(path):
    """{weight name: (in, out)} of the model's 2-D blk.* weights, and its architecture."""
    r = gguf.GGUFReader(path)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    shapes = {}
    for t in r.tensors:
        if t.name.startswith("blk.") and len(t.shape) == 2:
            shapes[t.name] = (int(t.shape[0]), int(t.shape[1]))
    return arch, shapes


def write(model, out, preset):
    p = PRESETS[preset]
    arch, shapes = model_shapes(model)
    rng = np.random.Generator(np.random.PCG64(p["seed"]))
    w = gguf.GGUFWriter(out, arch)
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", p["alpha"])
    r = p["rank"]
    scale = p["alpha"] / r
    for name in sorted(shapes, key=lambda n: (int(n.split(".")[1]), n)):
        if name.split(".")[2] not in p["targets"]:
            continue
        n_in, n_out = shapes[name]
        # x·Aᵀ has std ~|x|/sqrt(in)·sqrt(in)·std_a; B·scale maps it to STRENGTH·|x|-sized rows.
        a = uniform(rng, r * n_in, 1.0 / np.sqrt(n_in)).reshape(r, n_in)
        b = uniform(rng, n_out * r, STRENGTH / (scale * np.sqrt(r))).reshape(n_out, r)
        w.add_tensor(name + ".lora_a", a)  # numpy [r, in] -> ne [in, r]
        w.add_tensor(name + ".lora_b", b)  # numpy [out, r] -> ne [r, out]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--preset", choices=sorted(PRESETS), required=True)
    a = ap.parse_args()
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    write(a.model, a.out, a.preset)
    print(sha256(a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
