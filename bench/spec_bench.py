"""Speculative decoding by prompt lookup: TinyServe against llama.cpp, each with and without it.

Every task is a chat prompt answered greedily by SmolLM2-135M-Instruct (the same GGUF, thread
count and max tokens on both sides). TinyServe runs `tinyserve generate --spec-tokens 0|N`;
llama.cpp runs through llama-cpp-python, plainly and with its LlamaPromptLookupDecoding draft
model (num_pred_tokens N), each in its own process. Reported: decode tokens/s (first token to
last), speculative acceptance, whether the speculative output equals the plain one, and the
ratios. Tasks: quoting a passage, editing code, quoting from a long document (~6.3K tokens of
context), editing a long file (60 functions, ~3K tokens) and free writing, where lookup finds
little to draft. The two long tasks also run with quest selection (--budget tokens per step),
where each verified row selects its own pages.

  .venv/bin/python bench/spec_bench.py [--binary build/bin/tinyserve] [--threads 1] [--reps 3]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.environ.get("TINYSERVE_DATA", os.path.join(ROOT, "..", "shared", "data"))
MODEL = os.path.expanduser("~/.cache/tinyserve/SmolLM2-135M-Instruct.Q4_1.gguf")

CODE = """def fibonacci(n):
    if n <= 1:
        return n
    a, b = 0, 1
    for i in range(2, n + 1):
        a, b = b, a + b
    return b

def factorial(n):
    result = 1
    for i in range(2, n + 1):
        result = result * i
    return result

def mean(values):
    total = 0
    for v in values:
        total = total + v
    return total / len(values)"""


def long_code():
    """60 small functions (~3K tokens), all alike but for their names and constants."""
    names = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "theta", "kappa"]
    return "\n".join(f"""def {names[i % 8]}_{i}(values):
    result = 0
    for v in values:
        if v > {i}:
            result = result + v * {i % 7 + 1}
        else:
            result = result - v
    return result
""" for i in range(60))


def tasks():
    """(name, prompt, max tokens, long: also run with quest)."""
    alice = open(os.path.join(DATA, "text", "alice29.txt"), encoding="utf-8").read()
    lines = alice.splitlines()
    passage = "\n".join(lines[199:215])
    doc = "\n".join(lines[100:560])
    return [
        ("quote", "Repeat the following text exactly, word for word:\n\n" + passage, 200, False),
        ("code edit", "Rename the variable result to product in this Python code and show "
                      "the full code:\n\n" + CODE, 300, False),
        ("long-doc quote", doc + "\n\nCopy, word for word, the paragraph of the text above "
                                 "that begins with \"There were doors all round the hall\".", 200,
         True),
        ("long code edit", "Rename the variable result to total in every function of this Python "
                           "code and show the full code:\n\n" + long_code(), 300, True),
        ("free writing", "Write a short story about a dragon who learns to bake bread.", 200,
         False),
    ]


def run_tinyserve(a, prompt, max_tokens, spec, policy="dense"):
    cmd = [a.binary, "generate", "--model", a.model, "--threads", str(a.threads), "--chat",
           "--max-tokens", str(max_tokens), "--spec-tokens", str(spec), "--spec-ngram-min",
           str(a.ngram_min), "--spec-ngram-max", str(a.ngram_max), "--max-context", "8192",
           "--policy", policy, "--budget", str(a.budget), "--prompt", prompt]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    tail = p.stderr.strip().splitlines()[-1]
    m = re.search(r"generated (\d+) tokens.*decode ([\d.]+) tok/s", tail)
    acc = re.search(r"speculative: (\d+) of (\d+)", tail)
    return {"text": p.stdout, "tokens": int(m.group(1)), "tps": float(m.group(2)),
            "accepted": int(acc.group(1)) if acc else 0, "drafted": int(acc.group(2)) if acc else 0}


def llama_child(a):
    """In its own process: one llama.cpp run, printed as JSON."""
    import time
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    draft = LlamaPromptLookupDecoding(num_pred_tokens=a.spec) if a.spec > 0 else None
    llm = Llama(model_path=a.model, n_ctx=8192, n_threads=a.threads, n_threads_batch=a.threads,
                n_batch=512, verbose=False, draft_model=draft,
                logits_all=draft is not None)  # its draft path needs the full score table
    prompt = json.loads(sys.stdin.read())
    t_first, n, text = None, 0, ""
    for chunk in llm.create_chat_completion([{"role": "user", "content": prompt["text"]}],
                                            max_tokens=prompt["max_tokens"], temperature=0.0,
                                            stream=True):
        delta = chunk["choices"][0]["delta"].get("content")
        if not delta:
            continue
        if t_first is None:
            t_first = time.perf_counter()
        n += 1
        text += delta
    tps = (n - 1) / (time.perf_counter() - t_first) if n > 1 else 0.0
    print(json.dumps({"text": text, "tokens": n, "tps": tps}))


def run_llama(a, prompt, max_tokens, spec):
    cmd = [a.llama_python, os.path.abspath(__file__), "--llama-child", "--model", a.model,
           "--threads", str(a.threads), "--spec", str(spec)]
    p = subprocess.run(cmd, input=json.dumps({"text": prompt, "max_tokens": max_tokens}),
                       capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def median_run(fn, reps):
    runs = [fn() for _ in range(reps)]
    best = dict(runs[0])
    best["tps"] = statistics.median(r["tps"] for r in runs)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "bin", "tinyserve"))
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--spec", type=int, default=8, help="drafted tokens per step (both engines)")
    ap.add_argument("--ngram-min", type=int, default=2)
    ap.add_argument("--ngram-max", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budget", type=int, default=1024, help="quest's tokens per step")
    ap.add_argument("--llama-python", default=sys.executable)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--llama-child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.llama_child:
        return llama_child(a)
    rows = []
    for name, prompt, max_tokens, long in tasks():
        ll0 = median_run(lambda: run_llama(a, prompt, max_tokens, 0), a.reps)
        ll1 = median_run(lambda: run_llama(a, prompt, max_tokens, a.spec), a.reps)
        for policy in ("dense", "quest") if long else ("dense",):
            ts0 = median_run(lambda: run_tinyserve(a, prompt, max_tokens, 0, policy), a.reps)
            ts1 = median_run(lambda: run_tinyserve(a, prompt, max_tokens, a.spec, policy), a.reps)
            row = {"task": name if policy == "dense" else f"{name}, quest {a.budget}",
                   "policy": policy, "tinyserve": ts0["tps"], "tinyserve_spec": ts1["tps"],
                   "accepted": ts1["accepted"], "drafted": ts1["drafted"],
                   "tokens": ts1["tokens"], "same_output": ts0["text"] == ts1["text"],
                   "llama": ll0["tps"], "llama_spec": ll1["tps"],
                   "llama_same_output": ll0["text"] == ll1["text"]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\nSmolLM2-135M-Instruct Q4_1, {a.threads} thread(s), greedy, --spec-tokens {a.spec} "
          f"(ngram {a.ngram_min}..{a.ngram_max}); llama.cpp: LlamaPromptLookupDecoding("
          f"num_pred_tokens={a.spec}). Decode tokens/s, medians of {a.reps}.\n")
    print("| task | tokens | TinyServe | + spec | accepted | spec speed-up | llama.cpp | + lookup | "
          "TinyServe+spec / llama.cpp+lookup |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        acc = f"{r['accepted']}/{r['drafted']}" if r["drafted"] else "0/0"
        same = "" if r["same_output"] else " (output differs)"
        print(f"| {r['task']} | {r['tokens']} | {r['tinyserve']:.1f} | {r['tinyserve_spec']:.1f}{same} | "
              f"{acc} | {r['tinyserve_spec'] / r['tinyserve']:.2f}x | {r['llama']:.1f} | "
              f"{r['llama_spec']:.1f} | {r['tinyserve_spec'] / r['llama_spec']:.2f}x |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"threads": a.threads, "spec": a.spec, "budget": a.budget, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
