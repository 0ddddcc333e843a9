#!/usr/bin/env python3
"""Golden outputs of SmolLM2-135M-Instruct requantized to every type TinyServe converts at load
(scripts/make_kquant_model.py: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, Q5_0, Q5_1, IQ4_NL), from
llama.cpp (llama-cpp-python), for tests/cluster/kquant_test.py.

The model is generated, never committed: make_kquant_model.py writes it byte for byte the same
on any machine from the downloaded Q4_1 file (the golden records both sha256s; the test checks
them before comparing). What is recorded is make_lora_goldens.run's: prompt logprobs of three
texts with llama.cpp's own spread between batch sizes, and 24 greedy tokens after two prompts
with the gap between the two best logits at each step.

Dev-time only (CI reads the committed output):
  .venv/bin/python scripts/make_kquant_goldens.py
Writes tests/golden/smollm2/kquant.json. (The llama-cpp-python build note in
scripts/make_lora_goldens.py applies here too.)
"""
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import make_kquant_model  # noqa: E402
import make_lora_goldens  # noqa: E402

OUT = os.path.join(ROOT, "tests", "golden", "smollm2", "kquant.json")


def main():
    import llama_cpp
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "smollm2-kquant-mix.gguf")
        make_kquant_model.write(make_lora_goldens.MODEL, model)
        out = {"generator": "scripts/make_kquant_goldens.py",
               "llama_cpp_python": llama_cpp.__version__,
               "source_sha256": make_kquant_model.sha256(make_lora_goldens.MODEL),
               "model_sha256": make_kquant_model.sha256(model),
               "outputs": make_lora_goldens.run(None, model)}
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=0)
        f.write("\n")
    print([g["text"][:60] for g in out["outputs"]["greedy"]])


if __name__ == "__main__":
    main()
