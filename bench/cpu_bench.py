#!/usr/bin/env python3
"""CPU speed of TinyServe against llama.cpp, side by side in one run (issue: CPU speed).

For each thread count, runs `tinyserve bench --json` (prefill 64/512; decode at each context,
batch 1 and 8, dense and quest) and llama.cpp through llama-cpp-python (same GGUF, same threads,
same contexts, same text tokens) in separate processes, several repetitions each (medians), and
reports ratios, peak RSS, and for decode the bytes-moved floor per step: weight bytes plus KV
bytes read, over the measured single-thread memory read bandwidth.

  .venv/bin/python bench/cpu_bench.py --threads 1,2 --json docs/perf/cpu_bench.json

--lora ADAPTER.gguf applies a LoRA adapter in both engines (multi-LoRA serving's per-token cost).

Needs llama-cpp-python in .venv (scripts/deps/requirements-dev.txt). --llama-python runs the peer
from another build, such as llama.cpp with its AMX kernels (docs/PERFORMANCE.md, "llama.cpp with
AMX").
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("TINYSERVE_CACHE", os.path.expanduser("~/.cache/tinyserve"))
DATA = os.environ.get("TINYSERVE_DATA", os.path.join(ROOT, "..", "shared", "data"))


def mem_bandwidth_gbs(mb=512, reps=5):
    """Single-thread read bandwidth: numpy sum over an array far larger than the caches."""
    a = np.ones(mb * (1 << 20) // 4, dtype=np.float32)
    a.sum()
    best = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a.sum()
        best.append(a.nbytes / (time.perf_counter() - t0) / 1e9)
    return statistics.median(best)


def run_tinyserve(args, threads):
    cmd = [args.binary, "bench", "--json", "--model", args.model, "--text", args.text,
           "--threads", str(threads), "--contexts", args.contexts, "--batches", args.batches,
           "--prompts", args.prompts, "--policies", "dense,quest", "--budget", str(args.budget),
           "--steps", str(args.steps), "--reps", str(args.reps)]
    if args.lora:
        cmd += ["--lora", args.lora]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return [json.loads(l) for l in out.splitlines() if l.startswith("{")]


def run_llama(args, threads):
    cmd = [args.llama_python, os.path.join(ROOT, "bench", "llama_cpp_child.py"), "--model",
           args.model, "--text", args.text, "--threads", str(threads), "--prompts", args.prompts,
           "--contexts", args.contexts, "--steps", str(args.steps), "--reps", str(args.reps)]
    if args.lora:
        cmd += ["--lora", args.lora]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "bin", "tinyserve"))
    ap.add_argument("--model", default=os.path.join(CACHE, "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--text", default=os.path.join(DATA, "text", "tinyshakespeare.txt"))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--contexts", default="128,1024,4096,8000")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--prompts", default="64,512")
    ap.add_argument("--budget", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--llama-python", default=sys.executable,
                    help="the Python whose llama-cpp-python is the peer (e.g. an AMX build)")
    ap.add_argument("--json", help="write all results here")
    ap.add_argument("--lora", help="a LoRA adapter (GGUF) both engines apply to every token "
                    "(scripts/make_lora_adapter.py makes one)")
    args = ap.parse_args()
    bw = mem_bandwidth_gbs()
    results = {"mem_read_gbs": bw, "date": time.strftime("%Y-%m-%d %H:%M"), "runs": []}
    print(f"memory read bandwidth (1 thread): {bw:.1f} GB/s")
    for t in [int(x) for x in args.threads.split(",")]:
        ts = run_tinyserve(args, t)
        lc = run_llama(args, t)
        results["runs"].append({"threads": t, "tinyserve": ts, "llama_cpp": lc})
        print(f"\n== {t} thread(s) ==")
        for r in ts:
            if r["kind"] == "prefill":
                peer = lc["prefill"][str(r["prompt"])]
                print(f"prefill {r['prompt']:>4}: tinyserve {r['tokens_per_s']:8.1f} tok/s  "
                      f"llama.cpp {peer:8.1f}  ratio {r['tokens_per_s'] / peer:5.2f}")
        for r in ts:
            if r["kind"] != "decode":
                continue
            peer = lc["decode"].get(str(r["context"]))
            kv = r["context"] * r["kv_bytes_per_token"] * r["kv_bytes_ratio"] * r["batch"]
            floor_ms = (r["weight_bytes"] + kv) / (bw * 1e9) * 1e3
            step_ms = r["step_ms"]
            line = (f"decode ctx {r['context']:>5} batch {r['batch']} {r['policy']:<5}: "
                    f"{r['tokens_per_s']:8.1f} tok/s  step {step_ms:7.2f} ms  floor {floor_ms:6.2f} ms "
                    f"({floor_ms / step_ms:4.2f} of it)")
            if r["batch"] == 1 and peer:
                line += f"  llama.cpp {peer:7.1f} tok/s  ratio {r['tokens_per_s'] / peer:5.2f}"
            print(line)
        rss = [r for r in ts if r["kind"] == "rss"]
        print(f"peak RSS: tinyserve {rss[0]['peak_rss_mb']:.0f} MB, llama.cpp {lc['peak_rss_mb']:.0f} MB"
              f"; tinyserve CPU kernels: {rss[0].get('cpu_kernels', '?')}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
