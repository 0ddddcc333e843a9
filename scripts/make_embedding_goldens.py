#!/usr/bin/env python3
"""Golden embeddings of SmolLM2-135M-Instruct Q4_1 from llama.cpp (llama-cpp-python with
embedding=True), for TinyServe's Embed RPC and /v1/embeddings (tests/cluster/embeddings_test.py).

For each text (token ids from llama.cpp's tokenizer, no BOS: SmolLM2 adds none) and each pooling,
last and mean: the hidden state after the model's final norm, pooled over the tokens, unnormalized
(llama.cpp's t_embd; llama-cpp-python's embed(normalize=False)), rounded to 5 significant digits.
The texts include a long one (over 512 tokens) so that TinyServe's chunked prefill is crossed.

Dev-time only (CI reads the committed output):
  .venv/bin/python scripts/make_embedding_goldens.py
Writes tests/golden/smollm2/embeddings.json. (The llama-cpp-python build note in
scripts/make_lora_goldens.py applies here too.)
"""
import hashlib
import json
import os

import llama_cpp
from llama_cpp import Llama

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("TINYSERVE_CACHE", os.path.expanduser("~/.cache/tinyserve"))
MODEL = os.path.join(CACHE, "SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = os.path.join(ROOT, "tests", "golden", "smollm2", "embeddings.json")
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A paged KV cache keeps a bounding box of its keys.",
    "What is the capital of France?",
    " ".join(f"Sentence number {i} talks about the weather in a small town by the sea."
             for i in range(48)),
]
POOLINGS = {"last": llama_cpp.LLAMA_POOLING_TYPE_LAST, "mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN}


def main():
    with open(MODEL, "rb") as f:
        model_sha = hashlib.sha256(f.read()).hexdigest()
    out = {"generator": "scripts/make_embedding_goldens.py",
           "llama_cpp_python": llama_cpp.__version__, "model_sha256": model_sha, "texts": []}
    models = {name: Llama(model_path=MODEL, embedding=True, pooling_type=p, n_ctx=2048,
                          n_batch=2048, n_ubatch=2048, n_threads=2, verbose=False)
              for name, p in POOLINGS.items()}
    for text in TEXTS:
        ids = models["last"].tokenize(text.encode("utf-8"), add_bos=False, special=False)
        entry = {"text": text, "ids": [int(t) for t in ids]}
        for name, llm in models.items():
            vec = llm.embed(text, normalize=False)
            entry[name] = [float(f"{v:.5g}") for v in vec]
        out["texts"].append(entry)
        print(f"{len(ids)} tokens: last[:3] {entry['last'][:3]} mean[:3] {entry['mean'][:3]}")
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
