"""GBNF-constrained decoding: TinyServe against llama.cpp on the same grammars.

Each row is a chat prompt answered by SmolLM2-135M-Instruct (the same GGUF, thread count and
max tokens on both sides), sampled at temperature 1 with seeds 3, 4 and 5, once without a
constraint and once per grammar. TinyServe runs `tinyserve generate --grammar-file`; llama.cpp
runs through llama-cpp-python with LlamaGrammar.from_string (llama-server's "grammar"), each run
in its own process. Reported: decode tokens/s (first token to last; medians over the seeds),
the cost of each grammar against the unconstrained rate of the same engine, whether every
output ended by itself ("stop") inside max_tokens, and TinyServe / llama.cpp.

  .venv/bin/python bench/grammar_bench.py [--binary build/bin/tinyserve] [--threads 1]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.expanduser("~/.cache/tinyserve/SmolLM2-135M-Instruct.Q4_1.gguf")

JSON_GBNF = r'''root ::= "{" ws member ( "," ws member )* "}"
value ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ( "," ws member )* )? "}"
member ::= string ws ":" ws value ws
array ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
string ::= "\"" ( [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) ){0,40} "\""
number ::= "-"? ( "0" | [1-9] [0-9]{0,8} ) ( "." [0-9]{1,6} )?
ws ::= [ \n]{0,4}
'''

# (name, prompt, grammar or None, max tokens)
TASKS = [
    ("none", "Write one sentence about the sea.", None, 60),
    ("sentence", "Write one sentence about the sea.",
     'root ::= [A-Z] [a-z ,]{10,200} "."\n', 60),
    ("yes/no because", "Is the sea salty? Answer and say why.",
     'root ::= ("Yes" | "No" | "Maybe") ", because " [a-z ,]{1,80} "."\n', 60),
    ("list", "Name three fruits as a list.",
     'root ::= "- " item ("\\n- " item){2}\n'
     'item ::= [A-Z] [a-z]{1,12} (" " [a-z]{1,12}){0,2}\n', 60),
    ("json", "Describe a cat as a JSON object with its name, age and colour.", JSON_GBNF, 100),
]
SEEDS = (3, 4, 5)


def run_tinyserve(a, prompt, grammar, max_tokens, seed):
    cmd = [a.binary, "generate", "--model", a.model, "--threads", str(a.threads), "--chat",
           "--max-tokens", str(max_tokens), "--temperature", "1", "--seed", str(seed),
           "--prompt", prompt]
    path = None
    if grammar is not None:
        fd, path = tempfile.mkstemp(suffix=".gbnf")
        with os.fdopen(fd, "w") as f:
            f.write(grammar)
        cmd += ["--grammar-file", path]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    finally:
        if path:
            os.unlink(path)
    tail = p.stderr.strip().splitlines()[-1]
    m = re.search(r"generated (\d+) tokens.*decode ([\d.]+) tok/s", tail)
    tokens = int(m.group(1))
    return {"text": p.stdout, "tokens": tokens, "tps": float(m.group(2)),
            "stop": tokens < max_tokens}


def llama_child(a):
    """In its own process: one llama.cpp run, printed as JSON."""
    import time
    from llama_cpp import Llama, LlamaGrammar
    task = json.loads(sys.stdin.read())
    llm = Llama(model_path=a.model, n_ctx=1024, n_threads=a.threads, n_threads_batch=a.threads,
                n_batch=512, verbose=False, seed=task["seed"])
    grammar = LlamaGrammar.from_string(task["grammar"], verbose=False) if task["grammar"] else None
    t_first, n, text, finish = None, 0, "", None
    for chunk in llm.create_chat_completion([{"role": "user", "content": task["prompt"]}],
                                            max_tokens=task["max_tokens"], temperature=1.0,
                                            top_p=1.0, top_k=0, min_p=0.0, repeat_penalty=1.0,
                                            seed=task["seed"], grammar=grammar, stream=True):
        choice = chunk["choices"][0]
        finish = choice.get("finish_reason") or finish
        delta = choice["delta"].get("content")
        if not delta:
            continue
        if t_first is None:
            t_first = time.perf_counter()
        n += 1
        text += delta
    tps = (n - 1) / (time.perf_counter() - t_first) if n > 1 else 0.0
    print(json.dumps({"text": text, "tokens": n, "tps": tps, "stop": finish == "stop"}))


def run_llama(a, prompt, grammar, max_tokens, seed):
    cmd = [a.llama_python, os.path.abspath(__file__), "--llama-child", "--model", a.model,
           "--threads", str(a.threads)]
    task = {"prompt": prompt, "grammar": grammar, "max_tokens": max_tokens, "seed": seed}
    p = subprocess.run(cmd, input=json.dumps(task), capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "bin", "tinyserve"))
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--llama-python", default=sys.executable)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--llama-child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.llama_child:
        return llama_child(a)
    rows = []
    for name, prompt, grammar, max_tokens in TASKS:
        ts = [run_tinyserve(a, prompt, grammar, max_tokens, s) for s in SEEDS]
        ll = [run_llama(a, prompt, grammar, max_tokens, s) for s in SEEDS]
        row = {"task": name, "tinyserve": statistics.median(r["tps"] for r in ts),
               "llama": statistics.median(r["tps"] for r in ll),
               "tinyserve_stop": sum(r["stop"] for r in ts),
               "llama_stop": sum(r["stop"] for r in ll),
               "tinyserve_sample": ts[0]["text"], "llama_sample": ll[0]["text"]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    base_ts, base_ll = rows[0]["tinyserve"], rows[0]["llama"]
    print(f"\nSmolLM2-135M-Instruct Q4_1, {a.threads} thread(s), temperature 1, seeds "
          f"{', '.join(map(str, SEEDS))}; decode tokens/s, medians. 'ended' counts outputs "
          f"that ended by themselves inside max_tokens.\n")
    print("| grammar | TinyServe | vs none | ended | llama.cpp | vs none | ended | "
          "TinyServe / llama.cpp |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['task']} | {r['tinyserve']:.1f} | {r['tinyserve'] / base_ts:.2f} | "
              f"{r['tinyserve_stop']}/{len(SEEDS)} | {r['llama']:.1f} | "
              f"{r['llama'] / base_ll:.2f} | {r['llama_stop']}/{len(SEEDS)} | "
              f"{r['tinyserve'] / r['llama']:.2f}x |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"threads": a.threads, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
