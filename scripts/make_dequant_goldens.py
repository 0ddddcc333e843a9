#!/usr/bin/env python3
"""Writes the dequantizer golden files under tests/golden/dequant/ using the `gguf` package.

For each type T of F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K, Q2_K, Q3_K, Q5_K,
IQ4_NL, IQ4_XS:
  T.blocks        the raw block bytes of 512 elements, as stored in a GGUF file
  T.dequant.f32   gguf.quants.dequantize of those bytes: 512 little-endian float32
and once:
  input.f32       the 512 float32 inputs that the quantizable types were made from

The inputs are deterministic (numpy default_rng, seed 20240601): mostly N(0, 1) scaled per block,
plus an all-zero block (d = 0), a block of one repeated value (max == min) and a block with
one large outlier. gguf has no quantizer for the K-quants and IQ4 types, so their blocks are
random bytes with valid, finite fp16 scales; the dequantizer sees every code path all the same.
(Types added later draw from the generator after the earlier ones, so earlier files do not change.)

Run from the repository root:  .venv/bin/python scripts/make_dequant_goldens.py
The C++ side is kernels/cpu/dequant_test.cc.
"""

import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

N = 512
SEED = 20240601
OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden",
                       "dequant")


def make_input(rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal(N).astype(np.float32)
    # Per-32 block scales over several decades, so fp16 scales see small and large values.
    scales = np.exp(rng.uniform(-4.0, 3.0, N // 32)).astype(np.float32)
    x *= np.repeat(scales, 32)
    x[32:64] = 0.0                  # all-zero block: d == 0 path
    x[64:96] = np.float32(0.3125)   # constant block: max == min
    x[96 + 7] = np.float32(-40.0)   # an outlier that sets the scale
    return x.astype(np.float32)


def random_fp16_scale(rng: np.random.Generator, count: int, lo: float, hi: float) -> np.ndarray:
    return rng.uniform(lo, hi, count).astype(np.float16).view(np.uint8).reshape(count, 2)


def make_q4_k(rng: np.random.Generator) -> np.ndarray:
    nb = N // 256
    d = random_fp16_scale(rng, nb, 1e-3, 5e-2)
    dmin = random_fp16_scale(rng, nb, 1e-3, 5e-2)
    scales = rng.integers(0, 256, (nb, 12), dtype=np.uint8)
    qs = rng.integers(0, 256, (nb, 128), dtype=np.uint8)
    return np.concatenate([d, dmin, scales, qs], axis=1).reshape(-1)


def make_q6_k(rng: np.random.Generator) -> np.ndarray:
    nb = N // 256
    ql = rng.integers(0, 256, (nb, 128), dtype=np.uint8)
    qh = rng.integers(0, 256, (nb, 64), dtype=np.uint8)
    scales = rng.integers(-128, 128, (nb, 16), dtype=np.int8).view(np.uint8)
    d = random_fp16_scale(rng, nb, 1e-4, 1e-2)
    return np.concatenate([ql, qh, scales, d], axis=1).reshape(-1)


def random_k_block(rng: np.random.Generator, parts) -> np.ndarray:
    """Blocks of N // 256 super-blocks laid out as parts: ("bytes", n) random bytes or
    ("f16", lo, hi) one random fp16 scale."""
    nb = N // 256
    cols = []
    for part in parts:
        if part[0] == "bytes":
            cols.append(rng.integers(0, 256, (nb, part[1]), dtype=np.uint8))
        else:
            cols.append(random_fp16_scale(rng, nb, part[1], part[2]))
    return np.concatenate(cols, axis=1).reshape(-1)


# Super-block layouts (ggml-common.h): the order of the fields is the order in the block.
LATER_TYPES = [
    (T.Q2_K, [("bytes", 16), ("bytes", 64), ("f16", 1e-3, 5e-2), ("f16", 1e-3, 5e-2)]),
    (T.Q3_K, [("bytes", 32), ("bytes", 64), ("bytes", 12), ("f16", 1e-3, 5e-2)]),
    (T.Q5_K, [("f16", 1e-3, 5e-2), ("f16", 1e-3, 5e-2), ("bytes", 12), ("bytes", 32),
              ("bytes", 128)]),
    (T.IQ4_XS, [("f16", 1e-4, 1e-2), ("bytes", 2), ("bytes", 4), ("bytes", 128)]),
]


def make_iq4_nl(rng: np.random.Generator) -> np.ndarray:
    nb = N // 32
    d = random_fp16_scale(rng, nb, 1e-4, 1e-2)
    qs = rng.integers(0, 256, (nb, 16), dtype=np.uint8)
    return np.concatenate([d, qs], axis=1).reshape(-1)


def main() -> int:
    rng = np.random.default_rng(SEED)
    x = make_input(rng)
    os.makedirs(OUT_DIR, exist_ok=True)
    x.astype("<f4").tofile(os.path.join(OUT_DIR, "input.f32"))

    for qtype in (T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1):
        blocks = np.ascontiguousarray(quants.quantize(x, qtype)).view(np.uint8).reshape(-1)
        write(qtype, blocks)
    write(T.Q4_K, make_q4_k(rng))
    write(T.Q6_K, make_q6_k(rng))
    for qtype, parts in LATER_TYPES:
        write(qtype, random_k_block(rng, parts))
    write(T.IQ4_NL, make_iq4_nl(rng))
    return 0


def write(qtype: T, blocks: np.ndarray) -> None:
    block_size, type_size = quants.GGML_QUANT_SIZES[qtype]
    assert blocks.size == N // block_size * type_size, (qtype.name, blocks.size)
    y = quants.dequantize(blocks, qtype).astype(np.float32).reshape(-1)
    assert y.size == N and np.all(np.isfinite(y)), qtype.name
    blocks.tofile(os.path.join(OUT_DIR, f"{qtype.name}.blocks"))
    y.astype("<f4").tofile(os.path.join(OUT_DIR, f"{qtype.name}.dequant.f32"))
    print(f"{qtype.name}: {blocks.size} bytes of blocks, {y.size} floats")


if __name__ == "__main__":
    sys.exit(main())
