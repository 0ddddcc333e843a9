#!/usr/bin/env python3
"""Records reference logits of the generated test models with Hugging Face transformers.

Dev-time only (needs torch, transformers and tokenizers from the project venv .venv; CI never runs it):
  .venv/bin/python scripts/make_hf_goldens.py [--models-dir DIR] [--out tests/golden/hf]

It (re)generates the models with scripts/make_test_models.py into DIR (default
build/test-models), loads each with LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM / GPT2LMHeadModel (float32, eager
attention), runs the fixed token sequences below and writes the goldens.

Golden format (tests/golden/hf/):
  manifest.json
    {
      "format": 1,
      "generator": "scripts/make_test_models.py",
      "versions": {"torch": ..., "transformers": ..., "numpy": ...},
      "sequences": [[int, ...], ...],         # token ids, the same for every model; no BOS added
      "models": {
        "<model>": {                          # folder name under the models dir
          "files_sha256": {"<file>": "<hex>"},  # every file the generator wrote for the model
          "logits_file": "<model>.logits.bin",
          "vocab_size": V,
          "shapes": [[len_0, V], [len_1, V], ...]  # one per sequence
        }, ...
      },
      "tokenizer": {"file": "tokenizer.json", "cases": [{"text": str, "ids": [int, ...]}, ...]}
    }
  <model>.logits.bin
    Raw little-endian float32, no header: for each sequence s in order, logits[len_s][V]
    row-major (position-major), i.e. the full causal-LM output for every position of a single
    forward pass over the whole sequence (batch 1, no KV cache).

  "tokenizer.cases" are the ids the `tokenizers` library produces for a few texts with the
  generated tokenizer.json (encode without special-token post-processing; "<|endoftext|>" in
  the text is the special token 271).

Under CTest the models come from the fixture test `make_test_models` (FIXTURES_SETUP
hf_test_models, defined in worker/hf/CMakeLists.txt), which writes them to
${TINYSERVE_TEST_MODELS_DIR} (= <build>/test-models); a test declares FIXTURES_REQUIRED
hf_test_models and gets the folder via ENVIRONMENT TINYSERVE_TEST_MODELS=... . The fixture runs
make_test_models.py --verify tests/golden/hf/manifest.json, which fails if files_sha256 no longer
match, so a drift of the generator cannot silently stale the goldens.
Tolerances: F32 models should match to ~1e-4 absolute; the BF16/F16 files are exact in float32
too (transformers upcasts the stored values), so the same tolerance applies.
"""

import argparse
import json
import os
import re
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import make_test_models  # noqa: E402

SEQ_LENGTHS = [8, 17, 40]
# Text NFC changes (decomposed accents, singletons, Hangul jamo, marks out of canonical order, a
# composition exclusion, Greek with three marks) and text it keeps.
NFC_TEXTS = [
    "Cafe\u0301 de\u0301ja\u0300 vu",
    "\u212b for \u00c5, \u2126 for \u03a9",
    "\u1100\u1161\u11a8 and \u1100\u1161 jamo",
    "q\u0307\u0323 e\u0301\u0327 a\u0328\u0301",
    "\u0958 and \u0915\u093c",
    "\u03b1\u0313\u0301\u0345 \u1e9b\u0323",
    "\u0041\u030a\u0301 x\u0301\u0301",
    "already NFC: \u00e9 \u00fc \u00f1 \ufb01 \U0001f44d\U0001f3fd",
    "<|endoftext|>e\u0301<|endoftext|>\u0301",
]
TOKENIZER_TEXTS = [
    "the cat is on the mat",
    "Hello, world! It's 2024.",
    "  leading spaces and\nnew lines\t tabs",
    "héllo wörld — ünïcode ✓",
    "where<|endoftext|>there",
]


def sequences(vocab_size):
    """Fixed token sequences from a PCG64 stream (stable across numpy versions)."""
    bg = np.random.PCG64(20240611)
    out = []
    for n in SEQ_LENGTHS:
        raw = bg.random_raw(n)
        out.append([int(r % np.uint64(vocab_size)) for r in raw])
    out[0][0] = make_test_models.EOT_ID  # one sequence starts like a document
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models-dir", default=os.path.join(ROOT, "build", "test-models"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "golden", "hf"))
    args = ap.parse_args()

    import tokenizers
    import torch
    import transformers
    from transformers import (Gemma3ForCausalLM, GPT2LMHeadModel, LlamaForCausalLM,
                              Qwen2ForCausalLM, Qwen3ForCausalLM)

    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_test_models.py"),
                    args.models_dir], check=True)
    hashes, _ = make_test_models.write_models(args.models_dir)
    os.makedirs(args.out, exist_ok=True)
    seqs = sequences(make_test_models.VOCAB_SIZE)

    manifest = {
        "format": 1,
        "generator": "scripts/make_test_models.py",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "numpy": np.__version__, "tokenizers": tokenizers.__version__},
        "sequences": seqs,
        "models": {},
    }
    torch.manual_seed(0)
    for model in sorted(hashes):
        path = os.path.join(args.models_dir, model)
        with open(os.path.join(path, "config.json"), encoding="utf-8") as fh:
            model_type = json.load(fh)["model_type"]
        cls = {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM, "qwen3": Qwen3ForCausalLM,
               "gemma3_text": Gemma3ForCausalLM, "gpt2": GPT2LMHeadModel}[model_type]
        m = cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
        m.eval()
        chunks, shapes = [], []
        with torch.no_grad():
            for seq in seqs:
                ids = torch.tensor([seq], dtype=torch.long)
                logits = m(input_ids=ids).logits[0].to(torch.float32).numpy()
                chunks.append(np.ascontiguousarray(logits, dtype="<f4").tobytes())
                shapes.append(list(logits.shape))
        logits_file = f"{model}.logits.bin"
        with open(os.path.join(args.out, logits_file), "wb") as fh:
            fh.write(b"".join(chunks))
        manifest["models"][model] = {
            "files_sha256": hashes[model], "logits_file": logits_file,
            "vocab_size": make_test_models.VOCAB_SIZE, "shapes": shapes,
        }
        print(f"{model}: {cls.__name__}, logits {shapes}")

    tok = tokenizers.Tokenizer.from_file(os.path.join(args.models_dir, "gpt2-tiny",
                                                      "tokenizer.json"))
    manifest["tokenizer"] = {
        "file": "tokenizer.json",
        "cases": [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids}
                  for t in TOKENIZER_TEXTS],
    }
    # Qwen's NFC normalizer (qwen3-tiny-yarn's tokenizer.json): tokenizers' own NFC and ids.
    nfc = tokenizers.Tokenizer.from_file(os.path.join(args.models_dir, "qwen3-tiny-yarn",
                                                      "tokenizer.json"))
    manifest["tokenizer_nfc"] = {
        "model": "qwen3-tiny-yarn",
        "cases": [{"text": t, "normalized": tokenizers.normalizers.NFC().normalize_str(t),
                   "ids": nfc.encode(t, add_special_tokens=False).ids} for t in NFC_TEXTS],
    }
    text = json.dumps(manifest, indent=1, ensure_ascii=False)
    # Keep lists of numbers on one line.
    text = re.sub(r"\[\s*(-?\d+(?:,\s*-?\d+)*)\s*\]",
                  lambda mt: "[" + ", ".join(x.strip() for x in mt.group(1).split(",")) + "]", text)
    with open(os.path.join(args.out, "manifest.json"), "w", encoding="utf-8") as fh:
        fh.write(text + "\n")
    print(f"wrote {args.out}/manifest.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
