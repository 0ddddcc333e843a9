#!/usr/bin/env python3
"""Golden token masks of GBNF grammars from llama.cpp (llama-cpp-python), for TinyServe's
grammar-constrained decoding (tests/golden/grammar_golden_test.cc).

For each grammar and a text it matches, llama.cpp tokenizes the text with SmolLM2-135M-Instruct's
vocabulary; then, before each token of it and after the last, llama.cpp's grammar sampler
(llama_sampler_init_grammar, the code behind llama-server's "grammar" field) is applied to the
whole vocabulary, and the ids it leaves allowed are recorded: their count, an FNV-1a hash of them
(each id as 4 little-endian bytes, in increasing order), the ids themselves when there are at
most 64, and whether an end-of-generation token is allowed. Control tokens (llama.cpp lets their
text match the grammar; TinyServe never lets a special token through a grammar) are listed
separately and left out of the counts.

Dev-time only (CI reads the committed output):
  .venv/bin/python scripts/make_grammar_goldens.py
Writes tests/golden/grammar/grammar_masks.json.
"""
import ctypes
import hashlib
import json
import os

import llama_cpp
from llama_cpp import Llama

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("TINYSERVE_CACHE", os.path.expanduser("~/.cache/tinyserve"))
MODEL = os.path.join(CACHE, "SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = os.path.join(ROOT, "tests", "golden", "grammar", "grammar_masks.json")

# (name, grammar, a text it matches)
CASES = [
    ("list",
     'root ::= "- " item ("\\n- " item){2}\n'
     'item ::= [A-Z] [a-z]{1,12} (" " [a-z]{1,12}){0,2}\n',
     "- Apple pie\n- Banana\n- Cherry tart ok"),
    ("json",
     'root ::= value\n'
     'value ::= object | array | string | number | "true" | "false" | "null"\n'
     'object ::= "{" ws ( member ( "," ws member )* )? "}"\n'
     'member ::= string ws ":" ws value ws\n'
     'array ::= "[" ws ( value ws ( "," ws value ws )* )? "]"\n'
     'string ::= "\\"" ( [^"\\\\\\x00-\\x1f] | "\\\\" ( ["\\\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\\""\n'
     'number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n'
     'ws ::= [ \\t\\n]*\n',
     '{"name": "Ada", "langs": ["en", "fr"], "age": 36, "ok": true}'),
    ("unicode",
     'root ::= "Caf\u00e9 " [\u00e0-\u00ff]+ " \u5b57" [^\\n]{1,8} "\\n"\n',
     "Caf\u00e9 \u00e0\u00e9 \u5b57 abc \u00fc\n"),
    ("arithmetic",
     'root ::= expr\n'
     'expr ::= term (("+" | "-") term)*\n'
     'term ::= factor (("*" | "/") factor)*\n'
     'factor ::= [0-9]+ | "(" expr ")"\n',
     "12*(3+4)-56/(7)"),
    ("prefixes",
     '# shared prefixes and a class\n'
     'root ::= "the " ("cat" | "car" | "cart" | "care") " is " [a-z]+ "."\n',
     "the cart is red."),
    ("quoted",
     'root ::= "\\"" ( [^"\\\\] | "\\\\" . )* "\\"" " " .\n',
     '"say \\"hi\\" now" !'),
]


def fnv1a(ids):
    h = 0xcbf29ce484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little"):
            h ^= b
            h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def main():
    llm = Llama(model_path=MODEL, vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    control = [i for i in range(n) if llama_cpp.llama_vocab_is_control(vocab, i)]
    eog = [i for i in range(n) if llama_cpp.llama_vocab_is_eog(vocab, i)]
    skip = set(control) | set(eog)
    with open(MODEL, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    out = {"generator": "scripts/make_grammar_goldens.py",
           "reference": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}",
           "model_sha256": sha, "vocab_size": n, "control": control, "eog": eog, "cases": []}
    for name, grammar, text in CASES:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
        assert llm.detokenize(ids).decode("utf-8") == text, name
        smpl = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode("utf-8"), b"root")
        assert smpl, f"llama.cpp refused grammar {name}"
        steps = []
        for k in range(len(ids) + 1):
            data = (llama_cpp.llama_token_data * n)()
            for i in range(n):
                data[i].id = i
                data[i].logit = 0.0
                data[i].p = 0.0
            arr = llama_cpp.llama_token_data_array(data=data, size=n, selected=-1, sorted=False)
            llama_cpp.llama_sampler_apply(smpl, ctypes.byref(arr))
            allowed = [data[i].id for i in range(arr.size) if data[i].logit != float("-inf")]
            normal = sorted(i for i in allowed if i not in skip)
            step = {"count": len(normal), "fnv1a": fnv1a(normal),
                    "eog": any(i in allowed for i in eog)}
            if len(normal) <= 64:
                step["ids"] = normal
            steps.append(step)
            if k < len(ids):
                llama_cpp.llama_sampler_accept(smpl, ids[k])
        llama_cpp.llama_sampler_free(smpl)
        out["cases"].append({"name": name, "grammar": grammar, "text": text, "ids": ids,
                             "steps": steps})
        print(f"{name}: {len(ids)} tokens, allowed per step "
              f"{[s['count'] for s in steps]}")
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
