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
manifest.json also holds 64 greedy tokens after each short prompt (llama.cpp, argmax decoding).
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


def main():
    llm = Llama(model_path=MODEL, n_ctx=2048, n_threads=2, logits_all=True, verbose=False,
                seed=0, n_batch=512)
    os.makedirs(OUT, exist_ok=True)
    manifest = {"model_sha256": None, "fixed_ids": FIXED, "prompts": [], "llama_cpp_python": None}
    import llama_cpp
    manifest["llama_cpp_python"] = llama_cpp.__version__
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
        if name != "alice_long":
            # 64 greedy tokens, argmax at each step.
            gen = []
            last = logits[-1]
            for _ in range(64):
                nxt = int(np.argmax(last))
                gen.append(nxt)
                llm.eval([nxt])
                last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            entry["greedy_64"] = gen
            entry["prompt_ids"] = ids
        manifest["prompts"].append(entry)
        print(name, len(ids), "tokens", file=sys.stderr)
    with open(os.path.join(OUT, "logits.bin"), "wb") as f:
        f.write(blob)
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print("wrote", len(blob), "bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
