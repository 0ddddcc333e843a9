#!/usr/bin/env python3
"""Dense decode attention through torch.nn.functional.scaled_dot_product_attention, for the
comparison column of scripts/gpu-check.sh: the same geometries, batches, contexts (len =
context - 5) and dtype (f16) as kernels/cuda/bench/attention_bench.cu, on contiguous
[B, H, L, d] K/V, rotating over copies to exceed the L2. Each backend that accepts the call is
timed (CUDA events, warm-up, median); JSON lines to --out.
"""
import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F

GEOMS = [("smollm2", 9, 3, 64), ("7b", 32, 8, 128)]


def median_ms(fn, warmup, reps):
    for i in range(warmup):
        fn(i)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        fn(warmup + i)
        ends[i].record()
    torch.cuda.synchronize()
    ms = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return ms[reps // 2]


def backends():
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return [("default", None)]
    out = [("default", None)]
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        if hasattr(SDPBackend, name):
            out.append((name.lower(), (sdpa_kernel, getattr(SDPBackend, name))))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--max-seconds", type=float, default=1e9)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    out = open(args.out, "a") if args.out else None

    def emit(rec):
        line = json.dumps(rec)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    t0 = time.time()
    contexts = [8192, 32768] if args.quick else [4096, 8192, 32768, 131072]
    batches = [1, 16] if args.quick else [1, 16, 64]
    dev = torch.device("cuda")
    emit({"kind": "sdpa_env", "torch": torch.__version__, "device": torch.cuda.get_device_name(0)})
    for name, hq, hkv, d in GEOMS:
        for ctx in contexts:
            for b in batches:
                kv_bytes = b * ctx * 2 * hkv * d * 2
                if kv_bytes > 24e9:
                    continue
                if time.time() - t0 > args.max_seconds:
                    print("time limit reached; stopping", file=sys.stderr)
                    return 0
                L = ctx - 5
                sets = int(min(8, max(1, (400 << 20) // kv_bytes + 1)))
                k = torch.empty((sets, b, hkv, L, d), dtype=torch.float16, device=dev).uniform_(-1, 1)
                v = torch.empty_like(k).uniform_(-1, 1)
                q = torch.empty((sets, b, hq, 1, d), dtype=torch.float16, device=dev).uniform_(-1, 1)
                bytes_read = b * L * 2 * hkv * d * 2
                best = None
                for bname, ctxmgr in backends():
                    if bname == "math" and kv_bytes > 1e9:
                        continue  # the math path expands K/V per query head: slow, not a contender
                    def run(i, gqa=True):
                        r = i % sets
                        return F.scaled_dot_product_attention(q[r], k[r], v[r], enable_gqa=gqa)
                    try:
                        if ctxmgr is None:
                            ms = median_ms(run, 3, args.reps)
                        else:
                            with ctxmgr[0](ctxmgr[1]):
                                ms = median_ms(run, 3, args.reps)
                    except Exception as e:  # backend refuses these shapes / GQA
                        emit({"kind": "sdpa", "geom": name, "batch": b, "context": ctx,
                              "backend": bname, "error": str(e).splitlines()[0][:160]})
                        continue
                    rec = {"kind": "sdpa", "geom": name, "hq": hq, "hkv": hkv, "d": d,
                           "batch": b, "context": ctx, "backend": bname, "us": ms * 1e3,
                           "bytes": bytes_read, "GBps": bytes_read / (ms * 1e-3) / 1e9,
                           "sets": sets}
                    emit(rec)
                    if best is None or rec["us"] < best["us"]:
                        best = rec
                if best is not None:
                    emit(dict(best, kind="sdpa_best"))
                del k, v, q
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
