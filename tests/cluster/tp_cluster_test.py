"""Process-level test of a tensor-parallel worker: `tinyserve worker --tp-size 2 --tp-launch local`
(rank 0 serves, rank 1 is its child process, Gloo over loopback) behind a router, on stories260K.

  python tp_cluster_test.py --binary build/bin/tinyserve [--model PATH] [unittest args]

Checks: greedy tokens through the router equal a TP-1 worker's (one at a time and batched), also
with LoRA adapters (each rank applies its shard of the updates), given at start or loaded at run
time (every rank reads the file);
after `kill -9` of rank 1 the group turns unhealthy within a bounded time, the router marks it
down (tinyserve_router_worker_healthy 0) and stops sending to it, and rank 0 exits non-zero.
"""
import concurrent.futures
import os
import signal
import sys
import time

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_lib as cl  # noqa: E402
import cluster_test as ct  # noqa: E402  (request/generate helpers)


# Bounds of the failure path: rank 0 notices a dead rank at its next collective (the idle
# heartbeat every --tp-heartbeat s fails at once on a closed socket, else after --tp-timeout s)
# or through waitpid; the router needs a few health intervals on top.
TP_TIMEOUT_S = 5
HEARTBEAT_S = 0.5
UNHEALTHY_WITHIN_S = 15


def children_of(pid):
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                out.append(int(entry))
        except (OSError, IndexError, ValueError):
            pass
    return out


class TensorParallelClusterTest(cl.ClusterCase):

    def test_tp2_local_matches_tp1_and_dead_rank_goes_unhealthy(self):
        tp1 = self.cluster.worker()
        # A small KV pool for a quick start-up (the default, about 500 MiB, took seconds on a
        # loaded CI machine; start-up is bounded by --tp-startup-timeout, not --tp-timeout).
        tp2 = self.cluster.worker("--tp-size", "2", "--tp-launch", "local", "--tp-timeout",
                                  str(TP_TIMEOUT_S), "--tp-heartbeat", str(HEARTBEAT_S),
                                  "--kv-pages", "1024")
        ranks = children_of(tp2.popen.pid)
        self.assertEqual(len(ranks), 1, f"expected one child rank, got {ranks}")
        r = self.cluster.router([tp2])

        prompts = ct.PROMPTS[:6]
        reqs = [ct.request(p, max_tokens=32, ignore_eos=True) for p in prompts]
        want = [ct.generate(tp1.address, q, timeout=60) for q in reqs]
        for i, res in enumerate(want):
            self.assertEqual(res.code, grpc.StatusCode.OK, f"TP 1, request {i}: {res.details}")
        # One at a time through the router, then all at once (batched steps).
        for i, q in enumerate(reqs):
            got = ct.generate(r.address, q, timeout=60)
            self.assertEqual(got.code, grpc.StatusCode.OK, f"request {i}: {got.details}")
            self.assertEqual(got.complete.worker, tp2.address)
            self.assertEqual(got.ids, want[i].ids, f"request {i}: TP 2 differs from TP 1")
        with concurrent.futures.ThreadPoolExecutor(len(reqs)) as pool:
            batched = list(pool.map(lambda q: ct.generate(r.address, q, timeout=60), reqs))
        for i, got in enumerate(batched):
            self.assertEqual(got.code, grpc.StatusCode.OK, f"batched {i}: {got.details}")
            self.assertEqual(got.ids, want[i].ids, f"batched {i}: TP 2 differs from TP 1")
        healthy = lambda: cl.metric(r.metrics(), "tinyserve_router_worker_healthy",
                                    worker=tp2.address)
        self.assertEqual(healthy(), 1)

        # kill -9 rank 1: the group must go unhealthy within a bounded time.
        started = time.time()
        os.kill(ranks[0], signal.SIGKILL)
        self.assertTrue(cl.wait_for(lambda: healthy() == 0, UNHEALTHY_WITHIN_S),
                        f"router still marks the group up after {UNHEALTHY_WITHIN_S} s")
        took = time.time() - started
        sys.stderr.write(f"\ngroup marked unhealthy by the router {took:.2f} s after kill -9\n")
        # The router stops sending to it: nothing healthy is left, so requests fail fast.
        res = ct.generate(r.address, ct.request("Once upon a time", max_tokens=4), timeout=10)
        self.assertNotEqual(res.code, grpc.StatusCode.OK)
        self.assertNotEqual(res.code, grpc.StatusCode.DEADLINE_EXCEEDED, res.details)
        ok_before = cl.metric(r.metrics(), "tinyserve_router_requests_total",
                              worker=tp2.address, outcome="ok")
        self.assertEqual(ok_before, len(reqs) * 2)
        # Rank 0 drains and exits non-zero (a supervisor restarts the whole group).
        self.assertEqual(tp2.wait(timeout=20), 1)


    def test_tp2_with_lora_adapters_matches_tp1(self):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                        "scripts"))
        import make_lora_adapter
        tmp = self.cluster.log_dir
        lora = []
        for preset in ("all-r8", "attn-r4"):
            make_lora_adapter.write(self.cluster.model, f"{tmp}/{preset}.gguf", preset)
            lora += ["--lora", f"{preset}={tmp}/{preset}.gguf"]
        tp1 = self.cluster.worker(*lora)
        tp2 = self.cluster.worker("--tp-size", "2", "--tp-launch", "local", *lora)
        # The base and both adapters, each on two prompts, batched together on the group.
        reqs = []
        for adapter in ("", "all-r8", "attn-r4"):
            for p in ct.PROMPTS[:2]:
                q = ct.request(p, max_tokens=24, ignore_eos=True)
                q.lora_adapter = adapter
                reqs.append(q)
        want = [ct.generate(tp1.address, q, timeout=60) for q in reqs]
        with concurrent.futures.ThreadPoolExecutor(len(reqs)) as pool:
            got = list(pool.map(lambda q: ct.generate(tp2.address, q, timeout=60), reqs))
        for i, (w, g) in enumerate(zip(want, got)):
            self.assertEqual(w.code, grpc.StatusCode.OK, w.details)
            self.assertEqual(g.code, grpc.StatusCode.OK, g.details)
            self.assertEqual(g.ids, w.ids, f"request {i} ({reqs[i].lora_adapter!r})")
        self.assertNotEqual(want[0].ids, want[2].ids)  # the adapter changes the output
        self.assertNotEqual(want[2].ids, want[4].ids)

        # Loaded at run time on a TP-2 group (every rank reads the file): the same tokens; after
        # an unload the name is refused and the group still serves.
        rt = self.cluster.worker("--tp-size", "2", "--tp-launch", "local", "--allow-runtime-lora")
        S = ct.S
        with cl.channel(rt.address) as ch:
            S.grpc.TinyServeStub(ch).LoadLoraAdapter(
                S.pb.LoadLoraAdapterRequest(lora_name="all-r8", lora_path=f"{tmp}/all-r8.gguf"),
                timeout=60)
        for i in (2, 3):
            g = ct.generate(rt.address, reqs[i], timeout=60)
            self.assertEqual(g.code, grpc.StatusCode.OK, g.details)
            self.assertEqual(g.ids, want[i].ids, f"run-time adapter, request {i}")
        with cl.channel(rt.address) as ch:
            S.grpc.TinyServeStub(ch).UnloadLoraAdapter(
                S.pb.UnloadLoraAdapterRequest(lora_name="all-r8"), timeout=30)
        g = ct.generate(rt.address, reqs[2], timeout=60)
        self.assertEqual(g.code, grpc.StatusCode.INVALID_ARGUMENT, g.details)
        g = ct.generate(rt.address, reqs[0], timeout=60)
        self.assertEqual(g.code, grpc.StatusCode.OK, g.details)
        self.assertEqual(g.ids, want[0].ids)

        # Embeddings (rank 0 pools the all-reduced hidden states), base and adapter, both
        # poolings: the group's equal TP 1's to rounding.
        S = ct.S
        for adapter in ("", "all-r8"):
            for pooling in (S.pb.POOLING_LAST, S.pb.POOLING_MEAN):
                req = S.pb.EmbedRequest(inputs=[S.pb.EmbedInput(text=p) for p in ct.PROMPTS[:4]],
                                        pooling=pooling, lora_adapter=adapter)
                out = []
                for w in (tp1, tp2):
                    with cl.channel(w.address) as ch:
                        out.append(S.grpc.TinyServeStub(ch).Embed(req, timeout=60).embeddings)
                for a, b in zip(*out):
                    a, b = list(a.values), list(b.values)
                    err = max(abs(x - y) for x, y in zip(a, b)) / max(abs(x) for x in a)
                    self.assertLess(err, 1e-3, f"adapter {adapter!r}, pooling {pooling}")


if __name__ == "__main__":
    ct.S = cl.stubs()
    sys.exit(cl.run_tests())
