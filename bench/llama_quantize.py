#!/usr/bin/env python3
"""Quantizes a GGUF file with llama.cpp's own quantizer (llama-cpp-python's
llama_model_quantize, as the llama-quantize tool does), for benchmarks on the files users
download (Q4_K_M, Q5_K_M, Q6_K, IQ4_XS, ...).

  python bench/llama_quantize.py SOURCE.gguf OUT.gguf TYPE

TYPE is a llama.cpp file type name without the prefix: Q4_K_M, Q5_K_M, Q6_K, IQ4_XS, Q3_K_M,
Q2_K, Q5_0, ... A quantized source is requantized (allow_requantize), as llama-quantize
--allow-requantize does: the default SmolLM2 download is Q4_1, and no F16 copy is at hand
offline. Needs llama-cpp-python (scripts/deps/requirements-dev.txt).
"""
import ctypes
import sys

import llama_cpp


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    source, out, name = sys.argv[1:]
    ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + name.upper(), None)
    if ftype is None:
        sys.exit(f"unknown type {name}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(source.encode(), out.encode(), ctypes.byref(params))
    if rc != 0:
        sys.exit(f"llama_model_quantize failed ({rc})")


if __name__ == "__main__":
    main()
