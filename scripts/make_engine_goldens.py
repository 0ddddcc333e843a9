#!/usr/bin/env python3
"""Golden logits and greedy tokens of SmolLM2-135M-Instruct Q4_1 from llama.cpp (llama-cpp-python).

Dev-time only (CI reads the committed output): .venv/bin/python scripts/make_engine_goldens.py

For each prompt, llama.cpp evaluates the prompt's token ids (tokenized by llama.cpp itself, so the
token ids are the reference's) with logits at every position. The full logits are far too large
to commit (49,152 per position), so tests/golden/smollm2/logits.bin keeps, per position:
  argmax id, max logit, min logit, then the logits of 32 fixed vocabulary ids (the same for every
  position: ids spread over the vocabulary) and of llama.cpp's top 8 ids with those ids.
Format: little-endian; header u32 n_prompts; per prompt: u32 n_tokens, n_tokens x i32 ids,
then n_tokens records of: i32 argmax, f32 max, f32 min, 32 x f32 fixed, 8 x i32 top ids,
8 x f32 top logits. The fixed ids are in manifest.json.
manifest.json also holds 64 greedy tokens after each short prompt (llama.cpp, argmax decoding),
with the gap between the best and second-best logit at each of those steps.
"""
import hashlib
import json
import os
import struct
import sys

import numpy as np
from llama_cpp import Llama

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("TINYSERVE_CACHE", os.path.expanduser("~/.cache/tinyserve"))
DATA = os.environ.get("TINYSERVE_DATA", os.path.join(ROOT, "..", "shared", "data"))
MODEL = os.path.join(CACHE, "SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = os.path.join(ROOT, "tests", "golden", "smollm2")
FIXED = [int(i) for i in np.linspace(0, 49151, 32)]
FLASH_ATTN = os.environ.get("GOLDEN_FLASH_ATTN", "0") == "1"


def prompts():
    alice = open(os.path.join(DATA, "text", "alice29.txt"), encoding="utf-8").read()
    start = alice.index("CHAPTER I")
    return [
        ("capital", "The capital of France is", False),
        ("chat", "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                 "Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the tallest mountain on "
                 "Earth?<|im_end|>\n<|im_start|>assistant\n", True),
        ("alice_long", alice[start:start + 5200], False),
    ]


def greedy(llm, ids, n=64):
    """Greedy continuation after evaluating ids; returns (tokens, prompt logits, margins): the
    margin of step i is the gap between the best and second-best logit it chose from."""
    llm.reset()
    llm.eval(ids)
    logits = np.array(llm.scores[: len(ids)], dtype=np.float32)
    last, gen, margins = logits[-1], [], []
    for _ in range(n):
        nxt = int(np.argmax(last))
        gen.append(nxt)
        top2 = np.partition(last, -2)[-2:]
        margins.append(float(top2[1] - top2[0]))
        llm.eval([nxt])
        last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    return gen, logits, margins


def main():
    # flash_attn off: llama.cpp's CPU flash-attention accumulates V in fp16, which moves the
    # logits of long prompts by several percent of their range; the plain path keeps fp32 sums.
    llm = Llama(model_path=MODEL, n_ctx=2048, n_threads=2, logits_all=True, verbose=False,
                seed=0, n_batch=512, flash_attn=FLASH_ATTN)
    llm_tok = Llama(model_path=MODEL, n_ctx=2048, n_threads=2, logits_all=True, verbose=False,
                    seed=0, n_batch=1, flash_attn=FLASH_ATTN)
    os.makedirs(OUT, exist_ok=True)
    manifest = {"model_sha256": None, "fixed_ids": FIXED, "prompts": [], "llama_cpp_python": None}
    import llama_cpp
    manifest["llama_cpp_python"] = llama_cpp.__version__
    manifest["flash_attn"] = FLASH_ATTN
    with open(MODEL, "rb") as f:
        manifest["model_sha256"] = hashlib.sha256(f.read()).hexdigest()
    blob = bytearray(struct.pack("<I", len(prompts())))
    for name, text, special in prompts():
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)
        if name == "alice_long":
            assert len(ids) >= 1000, len(ids)
            ids = ids[:1100]
        llm.reset()
        llm.eval(ids)
        logits = np.array(llm.scores[: len(ids)], dtype=np.float32)
        blob += struct.pack("<I", len(ids)) + struct.pack(f"<{len(ids)}i", *ids)
        for row in logits:
            top = np.argsort(-row, kind="stable")[:8]
            blob += struct.pack("<iff", int(np.argmax(row)), float(row.max()), float(row.min()))
            blob += struct.pack("<32f", *row[FIXED].tolist())
            blob += struct.pack("<8i", *top.tolist()) + struct.pack("<8f", *row[top].tolist())
        entry = {"name": name, "special": special, "n_tokens": len(ids)}
        # llama.cpp against itself: the same prompt evaluated one token at a time (its decode
        # kernels) instead of in one batch (its prefill kernels). How far its own logits move
        # bounds how closely any other implementation can be expected to match them.
        gen_alt, alt, _ = greedy(llm_tok, ids)
        rng = logits.max(1) - logits.min(1)
        entry["llama_cpp_self_worst_share"] = float((np.abs(logits - alt).max(1) / rng).max())
        entry["llama_cpp_self_argmax_agreement"] = float((logits.argmax(1) == alt.argmax(1)).mean())
        if name != "alice_long":
            gen, _, margins = greedy(llm, ids)
            entry["greedy_64"] = gen
            entry["greedy_64_margins"] = [round(m, 4) for m in margins]
            entry["greedy_64_token_by_token"] = gen_alt
            entry["prompt_ids"] = ids
        print(name, entry["llama_cpp_self_worst_share"], entry["llama_cpp_self_argmax_agreement"],
              file=sys.stderr)
        manifest["prompts"].append(entry)
        print(name, len(ids), "tokens", file=sys.stderr)
    with open(os.path.join(OUT, "logits.bin"), "wb") as f:
        f.write(blob)
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print("wrote", len(blob), "bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
