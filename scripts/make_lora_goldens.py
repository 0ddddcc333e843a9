#!/usr/bin/env python3
"""Golden outputs of SmolLM2-135M-Instruct Q4_1 with LoRA adapters, from llama.cpp
(llama-cpp-python's lora_path), for TinyServe's multi-LoRA serving (tests/cluster/lora_test.py).

The adapters are random and generated, never committed: scripts/make_lora_adapter.py writes
them byte for byte the same on any machine (the golden records their sha256, and the test
checks it before comparing). For the base model and each adapter (presets all-r8 and attn-r4):
  - prompt logprobs of three texts (token ids from llama.cpp's tokenizer): per position i >= 1
    the log-softmax logprob of token i given tokens 0..i-1 and the top 2, evaluated in one batch,
    and "spread": how far llama.cpp's own logprob moves when it evaluates the text one token at
    a time instead (its sums run in another order; the test allows that much more);
  - 24 greedy tokens after two prompts, with the gap between the best and second-best logit at
    each step (the test compares tokens up to the first near tie).

Dev-time only (CI reads the committed output):
  .venv/bin/python scripts/make_lora_goldens.py
Writes tests/golden/smollm2/lora.json.

This machine's llama-cpp-python must be built without ggml's AMX kernels, which crash in
llama_decode on some AMX CPUs (0.3.36): CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON
-DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON" pip install llama-cpp-python.
"""
import hashlib
import json
import os
import sys
import tempfile

import numpy as np
from llama_cpp import Llama

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import make_lora_adapter  # noqa: E402
from make_prompt_logprob_goldens import TEXTS  # noqa: E402  (the same three texts)

CACHE = os.environ.get("TINYSERVE_CACHE", os.path.expanduser("~/.cache/tinyserve"))
MODEL = os.path.join(CACHE, "SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = os.path.join(ROOT, "tests", "golden", "smollm2", "lora.json")
PROMPTS = [
    "Once upon a time, there was a little girl who",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
]
GREEDY_TOKENS = 24


def log_softmax(logits):
    m = logits.max(axis=-1, keepdims=True)
    return logits - (m + np.log(np.exp(logits - m).sum(axis=-1, keepdims=True)))


def prompt_logprobs(llm, ids):
    llm.reset()
    llm.eval(ids)
    return log_softmax(np.array(llm.scores[: len(ids)], dtype=np.float64))


def run(lora_path, model=MODEL):
    """Prompt logprobs of TEXTS and greedy tokens after PROMPTS, by llama.cpp on `model` (with
    the adapter at lora_path, if any). Also used by scripts/make_kquant_goldens.py."""
    kw = {"lora_path": lora_path} if lora_path else {}
    llm = Llama(model_path=model, n_ctx=512, n_threads=2, logits_all=True, verbose=False,
                seed=0, n_batch=512, flash_attn=False, **kw)
    one = Llama(model_path=model, n_ctx=512, n_threads=2, logits_all=True, verbose=False,
                seed=0, n_batch=1, n_ubatch=1, flash_attn=False, **kw)
    texts = []
    for text in TEXTS:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
        logp = prompt_logprobs(llm, ids)
        logp_one = prompt_logprobs(one, ids)
        positions = []
        for i in range(1, len(ids)):
            row = logp[i - 1]
            top = np.argsort(-row, kind="stable")[:2]
            positions.append({"logprob": round(float(row[ids[i]]), 5),
                              "spread": round(abs(float(row[ids[i]] - logp_one[i - 1][ids[i]])), 4),
                              "top": [[int(t), round(float(row[t]), 5)] for t in top]})
        texts.append({"text": text, "ids": [int(t) for t in ids], "positions": positions})
    greedy = []
    for prompt in PROMPTS:
        ids = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
        llm.reset()
        llm.eval(ids)
        out, gaps = [], []
        for _ in range(GREEDY_TOKENS):
            row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
            order = np.argsort(-row, kind="stable")[:2]
            out.append(int(order[0]))
            gaps.append(round(float(row[order[0]] - row[order[1]]), 4))
            llm.eval([int(order[0])])
        greedy.append({"prompt": prompt, "prompt_ids": [int(t) for t in ids], "tokens": out,
                       "gaps": gaps,
                       "text": llm.detokenize(out).decode("utf-8", errors="replace")})
    return {"texts": texts, "greedy": greedy}


def main():
    import llama_cpp
    with open(MODEL, "rb") as f:
        model_sha = hashlib.sha256(f.read()).hexdigest()
    out = {"generator": "scripts/make_lora_goldens.py", "llama_cpp_python": llama_cpp.__version__,
           "model_sha256": model_sha, "adapters": {}, "outputs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        out["outputs"]["base"] = run(None)
        for preset in sorted(make_lora_adapter.PRESETS):
            path = os.path.join(tmp, preset + ".gguf")
            make_lora_adapter.write(MODEL, path, preset)
            out["adapters"][preset] = {"preset": preset, "sha256": make_lora_adapter.sha256(path)}
            out["outputs"][preset] = run(path)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=0)
        f.write("\n")
    for name, o in out["outputs"].items():
        print(f"{name}: {[g['text'][:60] for g in o['greedy']]}")


if __name__ == "__main__":
    main()
