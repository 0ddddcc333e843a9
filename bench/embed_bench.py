#!/usr/bin/env python3
"""Embedding throughput: TinyServe's Embed RPC (one worker, gRPC) against llama.cpp's embeddings
(llama-cpp-python, in process: no server in the way), on the same GGUF and thread count, one
after the other. Inputs are slices of a text of shared/data, --tokens tokens each (cut by
llama.cpp's tokenizer, sent to both as text; the token counts are TinyServe's), embedded --per-call at a time; last
pooling, unnormalized, prefix caching off. Reports inputs/s and tokens/s (medians of --reps) and the ratio, and the
cosine between the two engines' vectors (a sanity check that both embed the same thing).

  .venv/bin/python bench/embed_bench.py --binary build/bin/tinyserve --threads 2 \\
      --tokens 32,128,512 --inputs 32 --output docs/perf/embed_bench.json
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))
import cluster_lib as cl  # noqa: E402

CACHE = os.environ.get("TINYSERVE_CACHE", os.path.expanduser("~/.cache/tinyserve"))
DATA = os.environ.get("TINYSERVE_DATA", os.path.join(ROOT, "..", "shared", "data"))


def inputs_of(llm, text, n, tokens):
    """n texts of about `tokens` tokens each: slices of `text` cut by llama.cpp's tokenizer."""
    ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
    assert len(ids) >= tokens + n, "text too short"
    stride = max(1, (len(ids) - tokens) // n)
    return [llm.detokenize(ids[i * stride:i * stride + tokens]).decode("utf-8", "replace")
            for i in range(n)]


def timed(fn, reps):
    fn()  # warm-up
    times, out = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "bin", "tinyserve"))
    ap.add_argument("--model", default=os.path.join(CACHE, "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--text", default=os.path.join(DATA, "text", "alice29.txt"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", default="32,128,512")
    ap.add_argument("--inputs", type=int, default=32)
    ap.add_argument("--per-call", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--output")
    args = ap.parse_args()
    import llama_cpp
    from llama_cpp import Llama
    with open(args.text, encoding="utf-8", errors="replace") as f:
        text = f.read()
    S = cl.stubs()
    rows = []
    with cl.Cluster(args.binary, args.model) as cluster:
        # No prefix caching: the repetitions send the same inputs, which would be cache hits.
        w = cluster.worker("--threads", str(args.threads), "--max-batch", str(args.per_call),
                           "--no-prefix-caching")
        ch = cl.channel(w.address)
        stub = S.grpc.TinyServeStub(ch)
        for tokens in [int(t) for t in args.tokens.split(",")]:
            llm = Llama(model_path=args.model, embedding=True, verbose=False,
                        pooling_type=llama_cpp.LLAMA_POOLING_TYPE_LAST, n_threads=args.threads,
                        n_ctx=max(2048, tokens * args.per_call),
                        n_batch=max(2048, tokens * args.per_call),
                        n_ubatch=max(512, tokens))
            inputs = inputs_of(llm, text, args.inputs, tokens)
            calls = [inputs[i:i + args.per_call] for i in range(0, len(inputs), args.per_call)]

            counted = [0]

            def ours():
                counted[0] = 0
                out = []
                for c in calls:
                    req = S.pb.EmbedRequest(pooling=S.pb.POOLING_LAST, inputs=[
                        S.pb.EmbedInput(text=t) for t in c], add_special_tokens=False)
                    resp = stub.Embed(req, timeout=600)
                    counted[0] += resp.prompt_tokens
                    out += [list(e.values) for e in resp.embeddings]
                return out

            def theirs():
                out = []
                for c in calls:
                    out += llm.embed(c, normalize=False)
                return out

            t_ours, v_ours = timed(ours, args.reps)
            t_theirs, v_theirs = timed(theirs, args.reps)
            cos = [float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))
                   for a, b in zip(v_ours, v_theirs)]
            n, total = len(inputs), counted[0]
            row = {"tokens": tokens, "inputs": n, "prompt_tokens": total,
                   "per_call": args.per_call,
                   "threads": args.threads,
                   "tinyserve_inputs_per_s": round(n / t_ours, 2),
                   "llama_cpp_inputs_per_s": round(n / t_theirs, 2),
                   "tinyserve_tokens_per_s": round(total / t_ours, 1),
                   "llama_cpp_tokens_per_s": round(total / t_theirs, 1),
                   "ratio": round(t_theirs / t_ours, 2), "min_cosine": round(min(cos), 5)}
            rows.append(row)
            print(json.dumps(row), flush=True)
        ch.close()
    result = {"model": os.path.basename(args.model), "llama_cpp_python": llama_cpp.__version__,
              "rows": rows}
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
