#!/usr/bin/env python3
"""Writes SmolLM2-135M-Instruct requantized to a mix of every quantization TinyServe converts at
load (kernels/cpu/weight_convert.h): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS on ffn_down (the
only matrices whose rows, 1,536 wide, are whole K-quant super-blocks of 256; the others are 576
wide, which is why llama.cpp's own Q4_K_M of this model keeps them in 32-blocks too), and
Q5_0, Q5_1 and IQ4_NL on the other projections. Layer i's ffn_down takes K_TYPES[i % 6] and its
projection j SMALL_TYPES[(i + j) % 3]; token_embd (Q8_0), the norms and the metadata are the
source's bytes.

Usage:
  scripts/make_kquant_model.py SOURCE.gguf OUT.gguf

Used by tests/cluster/kquant_test.py (the same model served by TinyServe and by llama.cpp,
whose outputs scripts/make_kquant_goldens.py records) and by bench/cpu_bench.py --model.

The quantizers are plain round-to-nearest ones written here with numpy (gguf has none for these
types): each sub-block's scale (and minimum) from its range, the super-block's fp16 scales from
the largest, codes rounded; not llama.cpp's search for the best scales, so this file is a little
noisier than llama.cpp's quantizer would make it, which does not matter to a comparison on the
same file. Every tensor is read back through gguf's own dequantizers and must lie within the
type's rounding of its source values (a packing bug fails here). Float32 numpy only, so the file
is byte-for-byte the same on any machine (the test checks its sha256 against the golden).
"""
import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from gguf import quants

from make_lora_adapter import sha256  # noqa: F401  (the tests and the golden script use it)

K_TYPES = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS]
SMALL_TYPES = [T.Q5_0, T.Q5_1, T.IQ4_NL]
PROJECTIONS = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up"]
IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                 dtype=np.float32)
F32 = np.float32


def f16_bytes(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16).view(np.uint8).reshape(-1, 2)


def f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


def safe_div(a, b):
    return np.where(b != 0, a / np.where(b != 0, b, F32(1)), F32(0)).astype(np.float32)


def codes(x, step, lo, hi, offset=None):
    """round((x + offset) / step) clipped to [lo, hi], as uint8 (step 0 -> lo)."""
    v = x if offset is None else x + offset
    return np.clip(np.round(safe_div(v, step)), lo, hi).astype(np.int32)


def scales_and_mins(x, sub, levels, bits):
    """Shared by Q2_K, Q4_K, Q5_K: per sub-block (sub elements) a scale for codes 0..levels and a
    minimum (<= 0), both as integers of `bits` bits times a fp16 super-block scale."""
    nb = x.shape[0]
    xs = x.reshape(nb, -1, sub)
    mn = np.minimum(xs.min(axis=2), F32(0))
    scale = (xs.max(axis=2) - mn) / F32(levels)
    top = F32((1 << bits) - 1)
    d = f16(scale.max(axis=1) / top)
    dmin = f16((-mn).max(axis=1) / top)
    sc = codes(scale, d[:, None], 0, top)
    m = codes(-mn, dmin[:, None], 0, top)
    step = (d[:, None] * sc.astype(F32))[:, :, None]
    off = (dmin[:, None] * m.astype(F32))[:, :, None]
    q = codes(xs, step, 0, levels, offset=off).reshape(nb, -1)
    return d, dmin, sc, m, q


def pack_k4_scales(sc, m):
    """Q4_K/Q5_K's 12 bytes of eight 6-bit scales and mins (dequant.h ScaleMinK4)."""
    out = np.zeros((sc.shape[0], 12), dtype=np.int32)
    out[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    return out.astype(np.uint8)


def nibbles_k4(q):
    """Q4_K/Q5_K's 128 bytes: 64-element chunk c in qs[32c..32c+31], low nibble then high."""
    q = q.reshape(-1, 4, 2, 32) & 0xF
    return (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(-1, 128).astype(np.uint8)


def quant_q4_k(x):
    d, dmin, sc, m, q = scales_and_mins(x, 32, 15, 6)
    return [f16_bytes(d), f16_bytes(dmin), pack_k4_scales(sc, m), nibbles_k4(q)]


def quant_q5_k(x):
    d, dmin, sc, m, q = scales_and_mins(x, 32, 31, 6)
    hi = (q.reshape(-1, 8, 32) >> 4)  # sub-block j's fifth bit is bit j of qh[l]
    qh = (hi << np.arange(8).reshape(1, 8, 1)).sum(axis=1).astype(np.uint8)
    return [f16_bytes(d), f16_bytes(dmin), pack_k4_scales(sc, m), qh, nibbles_k4(q)]


def two_bit_planes(q):
    """Q2_K/Q3_K's 64 bytes: element 128n + 32s + 16h + l at bits 2s of byte 32n + 16h + l."""
    q = q.reshape(-1, 2, 4, 32) & 3
    return (q << (2 * np.arange(4)).reshape(1, 1, 4, 1)).sum(axis=2).reshape(-1, 64).astype(np.uint8)


def quant_q2_k(x):
    d, dmin, sc, m, q = scales_and_mins(x, 16, 3, 4)
    return [(sc | (m << 4)).astype(np.uint8), two_bit_planes(q), f16_bytes(d), f16_bytes(dmin)]


def quant_q3_k(x):
    nb = x.shape[0]
    xs = x.reshape(nb, 16, 16)
    scale = np.abs(xs).max(axis=2) / F32(4)
    d = f16(scale.max(axis=1) / F32(31))
    sc = codes(scale, d[:, None], 0, 31)                       # stored as sc + 32
    step = (d[:, None] * sc.astype(F32))[:, :, None]
    q = (codes(xs, step, -4, 3) + 4).reshape(nb, 256)          # 0..7: low 2 bits, high bit
    hbit = (q >> 2).reshape(nb, 8, 32)                          # plane 4n + s holds bit 4n + s
    hmask = (hbit << np.arange(8).reshape(1, 8, 1)).sum(axis=1).astype(np.uint8)
    s6 = sc + 32
    scales = np.zeros((nb, 12), dtype=np.int32)
    scales[:, 0:8] = (s6[:, 0:8] & 0xF) | ((s6[:, 8:16] & 0xF) << 4)
    hi = (s6 >> 4).reshape(nb, 4, 4)                            # j = 4a + b at bits 2a of 8 + b
    scales[:, 8:12] = (hi << (2 * np.arange(4)).reshape(1, 4, 1)).sum(axis=1)
    return [hmask, two_bit_planes(q), scales.astype(np.uint8), f16_bytes(d)]


def quant_q6_k(x):
    nb = x.shape[0]
    xs = x.reshape(nb, 16, 16)
    scale = np.abs(xs).max(axis=2) / F32(32)
    d = f16(scale.max(axis=1) / F32(127))
    sc = codes(scale, d[:, None], 0, 127)
    step = (d[:, None] * sc.astype(F32))[:, :, None]
    q = (codes(xs, step, -32, 31) + 32).reshape(nb, 2, 4, 32)  # [half][quarter][l]
    lo, hi = q & 0xF, q >> 4
    ql = np.concatenate([lo[:, :, 0] | (lo[:, :, 2] << 4), lo[:, :, 1] | (lo[:, :, 3] << 4)],
                        axis=2).reshape(nb, 128)
    qh = (hi << (2 * np.arange(4)).reshape(1, 1, 4, 1)).sum(axis=2).reshape(nb, 64)
    return [ql.astype(np.uint8), qh.astype(np.uint8), sc.astype(np.int8).view(np.uint8),
            f16_bytes(d)]


def iq4_codes(xs, dl):
    """Index of the nearest IQ4 level of xs / dl (dl per row of xs)."""
    v = safe_div(xs, dl[..., None])
    return np.abs(v[..., None] - IQ4NL).argmin(axis=-1).astype(np.int32)


def signed_absmax(xs):
    i = np.abs(xs).argmax(axis=-1)
    return np.take_along_axis(xs, i[..., None], axis=-1)[..., 0]


def quant_iq4_nl(x):
    xs = x.reshape(-1, 32)
    d = f16(signed_absmax(xs) / F32(-127))                     # the extreme value is level -127
    q = iq4_codes(xs, d)
    return [f16_bytes(d), (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)]


def quant_iq4_xs(x):
    nb = x.shape[0]
    xs = x.reshape(nb, 8, 32)
    scale = signed_absmax(xs) / F32(-127)
    d = f16(np.abs(scale).max(axis=1) / F32(31))
    ls = codes(scale, d[:, None], -32, 31) + 32
    q = iq4_codes(xs, d[:, None] * (ls - 32).astype(F32))
    scales_h = ((ls >> 4) << (2 * np.arange(8))).sum(axis=1).astype("<u2").view(np.uint8).reshape(nb, 2)
    lo = ls & 0xF
    scales_l = (lo[:, 0::2] | (lo[:, 1::2] << 4)).astype(np.uint8)
    qs = (q[:, :, :16] | (q[:, :, 16:] << 4)).reshape(nb, 128).astype(np.uint8)
    return [f16_bytes(d), scales_h, scales_l, qs]


QUANTIZERS = {T.Q2_K: quant_q2_k, T.Q3_K: quant_q3_k, T.Q4_K: quant_q4_k, T.Q5_K: quant_q5_k,
              T.Q6_K: quant_q6_k, T.IQ4_XS: quant_iq4_xs, T.IQ4_NL: quant_iq4_nl}
# Largest |dequantized - source| allowed, as a fraction of the block's largest |value|: a
# sub-block of 16 or 32 may have a small range inside a super-block with a large one, so the
# bound is on the super-block's scale, with slack for the integer scales' own rounding.
TOLERANCE = {T.Q2_K: 0.5, T.Q3_K: 0.35, T.Q4_K: 0.1, T.Q5_K: 0.05, T.Q6_K: 0.05,
             T.IQ4_XS: 0.15, T.IQ4_NL: 0.15, T.Q5_0: 0.07, T.Q5_1: 0.05}


def quantize(values, qtype):
    """Blocks of `qtype` for a float32 matrix [rows, cols] (cols a multiple of the block)."""
    block, size = quants.GGML_QUANT_SIZES[qtype]
    if qtype in QUANTIZERS:
        x = values.reshape(-1, block).astype(np.float32)
        parts = QUANTIZERS[qtype](x)
        blocks = np.concatenate([p.reshape(x.shape[0], -1) for p in parts], axis=1)
        assert blocks.shape[1] == size, (qtype.name, blocks.shape)
        blocks = blocks.reshape(values.shape[0], -1)
    else:
        blocks = quants.quantize(values, qtype)
    back = quants.dequantize(blocks, qtype).reshape(values.shape)
    ref = np.abs(values.reshape(-1, block)).max(axis=1, keepdims=True)
    err = np.abs(back.reshape(-1, block) - values.reshape(-1, block))
    assert np.all(err <= TOLERANCE[qtype] * ref + 1e-7), (qtype.name, float((err / (ref + 1e-30)).max()))
    return np.ascontiguousarray(blocks, dtype=np.uint8)


def plan(name):
    """The type a tensor is written in, or None to copy the source's bytes."""
    parts = name.split(".")
    if parts[0] != "blk" or parts[-1] != "weight":
        return None
    layer, proj = int(parts[1]), parts[2]
    if proj == "ffn_down":
        return K_TYPES[layer % len(K_TYPES)]
    if proj in PROJECTIONS:
        return SMALL_TYPES[(layer + PROJECTIONS.index(proj)) % len(SMALL_TYPES)]
    return None


def gguf_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def write(source, out):
    r = GGUFReader(source)
    raw = np.memmap(source, mode="r", dtype=np.uint8)
    alignment = 32
    if "general.alignment" in r.fields:
        alignment = int(r.fields["general.alignment"].parts[-1][0])
    kv_start = 24  # magic, version, tensor count, KV count
    kv_end = min(t.field.offset for t in r.tensors)
    tensors = []
    for t in r.tensors:
        qtype = plan(t.name)
        if qtype is None:
            data = np.asarray(raw[t.data_offset:t.data_offset + t.n_bytes])
            tensors.append((t.name, [int(v) for v in t.shape], int(t.tensor_type), data))
            continue
        rows, cols = int(t.shape[1]), int(t.shape[0])
        values = quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(rows, cols)
        tensors.append((t.name, [cols, rows], int(qtype),
                        quantize(values.astype(np.float32), qtype).reshape(-1)))
    with open(out, "wb") as f:
        f.write(bytes(raw[:kv_start]))
        f.write(bytes(raw[kv_start:kv_end]))
        offset = 0
        for name, shape, ttype, data in tensors:
            f.write(gguf_string(name) + struct.pack("<I", len(shape)))
            f.write(struct.pack(f"<{len(shape)}Q", *shape) + struct.pack("<IQ", ttype, offset))
            offset += (data.size + alignment - 1) // alignment * alignment
        f.write(b"\0" * (-f.tell() % alignment))
        for _, _, _, data in tensors:
            f.write(data.tobytes())
            f.write(b"\0" * (-data.size % alignment))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    write(sys.argv[1], sys.argv[2])
    print(f"{sys.argv[2]}: sha256 {sha256(sys.argv[2])}")
