"""One llama.cpp (llama-cpp-python) measurement in its own process, so its peak RSS is its own.

Prints one JSON object: prefill tokens/s per prompt length, decode tokens/s per context, peak RSS.
"""
import argparse
import json
import resource
import statistics
import time

from llama_cpp import Llama


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompts", default="64,512")
    ap.add_argument("--contexts", default="128,1024,4096,8000")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--lora", help="a LoRA adapter (GGUF) to apply")
    a = ap.parse_args()
    contexts = [int(x) for x in a.contexts.split(",") if x]
    prompts = [int(x) for x in a.prompts.split(",") if x]
    n_ctx = max(contexts + prompts) + a.steps + 8
    llm = Llama(model_path=a.model, n_ctx=n_ctx, n_threads=a.threads, n_threads_batch=a.threads,
                n_batch=512, verbose=False, logits_all=False,
                **({"lora_path": a.lora} if a.lora else {}))
    toks = llm.tokenize(open(a.text, encoding="utf-8").read().encode(), add_bos=False)
    out = {"engine": "llama.cpp", "threads": a.threads, "prefill": {}, "decode": {}}
    for p in prompts:
        times = []
        for _ in range(a.reps):
            llm.reset()
            t0 = time.perf_counter()
            llm.eval(toks[:p])
            times.append(time.perf_counter() - t0)
        out["prefill"][str(p)] = p / statistics.median(times)
    for c in contexts:
        rates = []
        for _ in range(a.reps):
            llm.reset()
            llm.eval(toks[:c])
            t0 = time.perf_counter()
            for i in range(a.steps):
                llm.eval([toks[c + i]])
            rates.append(a.steps / (time.perf_counter() - t0))
        out["decode"][str(c)] = statistics.median(rates)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


if __name__ == "__main__":
    main()
