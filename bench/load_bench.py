#!/usr/bin/env python3
"""Load benchmark of TinyServe's serving path: throughput, time to first token and
inter-token latency (p50/p99) at several concurrency levels, straight to a worker and
through the router (the difference is the router's overhead). Prints JSON.

Either against running servers:
  load_bench.py --worker HOST:PORT --router HOST:PORT
or starting its own (one worker + one router on free loopback ports):
  load_bench.py --binary build/bin/tinyserve --model ../shared/data/models/stories260K/stories260K.gguf

Quick on stories260K with the defaults; raise --requests / --max-tokens for a real run.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests", "cluster"))
import cluster_lib as cl  # noqa: E402


def one_stream(stub, pb, prompt, max_tokens, timeout):
    import grpc
    req = pb.GenerateRequest(text=prompt)
    req.sampling.max_tokens = max_tokens
    req.sampling.ignore_eos = True
    start = time.perf_counter()
    ttft, last, itls, tokens = None, None, [], 0
    try:
        for msg in stub.Generate(req, timeout=timeout):
            if msg.HasField("chunk") and msg.chunk.token_ids:
                now = time.perf_counter()
                if ttft is None:
                    ttft = now - start
                else:
                    itls.append((now - last) / len(msg.chunk.token_ids))
                last = now
                tokens += len(msg.chunk.token_ids)
        ok = True
    except grpc.RpcError:
        ok = False
    return {"ok": ok, "ttft": ttft, "itls": itls, "tokens": tokens,
            "e2e": time.perf_counter() - start}


def run_level(address, concurrency, requests, max_tokens, timeout):
    s = cl.stubs()
    ch = cl.channel(address)
    stub = s.grpc.TinyServeStub(ch)
    prompts = [f"Once upon a time there was a little {i} who" for i in range(requests)]
    results, wall = cl.run_concurrently(
        prompts, concurrency, lambda prompt: one_stream(stub, s.pb, prompt, max_tokens, timeout))
    ch.close()
    ttfts = [r["ttft"] for r in results if r["ttft"] is not None]
    itls = [x for r in results for x in r["itls"]]
    tokens = sum(r["tokens"] for r in results)
    ms = lambda v: None if v is None else round(1e3 * v, 3)
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "failed": sum(not r["ok"] for r in results),
        "tokens": tokens,
        "wall_seconds": round(wall, 3),
        "tokens_per_second": round(tokens / wall, 1) if wall > 0 else None,
        "requests_per_second": round(len(results) / wall, 2) if wall > 0 else None,
        "ttft_ms": {"p50": ms(cl.percentile(ttfts, 50)), "p99": ms(cl.percentile(ttfts, 99)),
                    "mean": ms(statistics.mean(ttfts)) if ttfts else None},
        "itl_ms": {"p50": ms(cl.percentile(itls, 50)), "p99": ms(cl.percentile(itls, 99))},
    }


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", help="worker HOST:PORT (with --router: use running servers)")
    p.add_argument("--router", help="router HOST:PORT")
    p.add_argument("--binary", help="tinyserve executable (to start a worker and a router)")
    p.add_argument("--model", help="model for the started worker")
    p.add_argument("--threads", type=int, default=1, help="worker CPU threads")
    p.add_argument("--concurrency", default="1,8,32", help="comma-separated stream counts")
    p.add_argument("--requests", type=int, default=0,
                   help="requests per level (default: 2 x concurrency, at least 8)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--output", help="also write the JSON here")
    a = p.parse_args()

    cluster = None
    if a.worker and a.router:
        worker, router = a.worker, a.router
    elif a.binary and a.model:
        cluster = cl.Cluster(a.binary, a.model)
        w = cluster.worker("--threads", str(a.threads))
        r = cluster.router([w])
        worker, router = w.address, r.address
    else:
        p.error("give --worker and --router, or --binary and --model")

    report = {"max_tokens": a.max_tokens, "worker": worker, "router": router, "levels": []}
    try:
        for address in (worker, router):  # warm-up: connections, first allocations
            run_level(address, 2, 4, 4, a.timeout)
        for c in (int(x) for x in a.concurrency.split(",")):
            n = a.requests or max(8, 2 * c)
            direct = run_level(worker, c, n, a.max_tokens, a.timeout)
            routed = run_level(router, c, n, a.max_tokens, a.timeout)
            overhead = None
            if direct["ttft_ms"]["p50"] is not None and routed["ttft_ms"]["p50"] is not None:
                overhead = round(routed["ttft_ms"]["p50"] - direct["ttft_ms"]["p50"], 3)
            report["levels"].append({"concurrency": c, "direct": direct, "router": routed,
                                     "router_ttft_overhead_ms_p50": overhead})
    finally:
        if cluster is not None:
            cluster.__exit__(None, None, None)
    cl.print_report(report, a.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
