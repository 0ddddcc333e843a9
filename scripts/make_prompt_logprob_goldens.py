#!/usr/bin/env python3
"""Golden prompt logprobs of SmolLM2-135M-Instruct Q4_1 from llama.cpp (llama-cpp-python), for
TinyServe's prompt_logprobs / completions echo with logprobs (openai_http_prompt_logprobs).

For each text, llama.cpp tokenizes it (so the ids are the reference's; TinyServe is sent the
ids), evaluates it with logits at every position (flash attention off, as in
make_engine_goldens.py), and records per position i >= 1: the log-softmax logprob of token i
given tokens 0..i-1, its rank, and the 5 most likely tokens with their logprobs.

Dev-time only (CI reads the committed output):
  .venv/bin/python scripts/make_prompt_logprob_goldens.py
Writes tests/golden/smollm2/prompt_logprobs.json.
"""
import hashlib
import json
import os

import numpy as np
from llama_cpp import Llama

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("TINYSERVE_CACHE", os.path.expanduser("~/.cache/tinyserve"))
MODEL = os.path.join(CACHE, "SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = os.path.join(ROOT, "tests", "golden", "smollm2", "prompt_logprobs.json")
TEXTS = [
    "The quick brown fox jumps over the lazy dog. Paris is the capital and largest city of "
    "France, with an estimated population of two million residents.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + "
    "fibonacci(n - 2)\n",
    "Question: Which planet is known as the Red Planet?\nAnswer: Mars",
]


def main():
    llm = Llama(model_path=MODEL, n_ctx=512, n_threads=2, logits_all=True, verbose=False,
                seed=0, n_batch=512, flash_attn=False)
    import llama_cpp
    with open(MODEL, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    out = {"generator": "scripts/make_prompt_logprob_goldens.py",
           "llama_cpp_python": llama_cpp.__version__, "model_sha256": sha, "texts": []}
    for text in TEXTS:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
        llm.reset()
        llm.eval(ids)
        logits = np.array(llm.scores[: len(ids)], dtype=np.float64)
        m = logits.max(axis=1, keepdims=True)
        logp = logits - (m + np.log(np.exp(logits - m).sum(axis=1, keepdims=True)))
        positions = []
        for i in range(1, len(ids)):
            row = logp[i - 1]
            top = np.argsort(-row, kind="stable")[:5]
            positions.append({
                "logprob": round(float(row[ids[i]]), 5),
                "rank": int((row > row[ids[i]]).sum()) + 1,
                "top": [[int(t), round(float(row[t]), 5)] for t in top],
            })
        out["texts"].append({"text": text, "ids": [int(t) for t in ids], "positions": positions})
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=0)
        f.write("\n")
    print(f"{OUT}: {len(out['texts'])} texts, "
          f"{sum(len(t['positions']) for t in out['texts'])} positions")


if __name__ == "__main__":
    main()
