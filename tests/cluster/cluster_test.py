"""Process-level tests of a TinyServe cluster: real workers and routers on loopback serving
stories260K, driven through the published protos (Python stubs generated at test time).

  python cluster_test.py --binary build/bin/tinyserve [--model PATH] [unittest args, e.g. -k queue]

Every test is bounded in time, and every process it starts is killed when it ends.
"""
import concurrent.futures
import os
import signal
import subprocess
import sys
import threading
import time

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_lib as cl  # noqa: E402

S = None  # generated stubs


def request(text=None, ids=None, max_tokens=16, **sampling):
    r = S.pb.GenerateRequest()
    if text is not None:
        r.text = text
    if ids is not None:
        r.token_ids.ids.extend(ids)
    r.sampling.max_tokens = max_tokens
    for k, v in sampling.items():
        setattr(r.sampling, k, v)
    return r


class Result:
    def __init__(self):
        self.ids, self.text, self.chunks = [], "", 0
        self.complete, self.error = None, None
        self.code, self.details = grpc.StatusCode.OK, ""
        self.cached_tokens = 0


def generate(address, req, timeout=30.0, cancel_after=None, metadata=None):
    """Streams one Generate; returns a Result (never raises for RPC errors)."""
    res = Result()
    with cl.channel(address) as ch:
        call = S.grpc.TinyServeStub(ch).Generate(req, timeout=timeout)
        try:
            for msg in call:
                if msg.HasField("chunk"):
                    res.chunks += 1
                    res.ids.extend(msg.chunk.token_ids)
                    res.text += msg.chunk.text
                    res.cached_tokens = msg.chunk.cached_tokens
                    if cancel_after is not None and res.chunks >= cancel_after:
                        call.cancel()
                elif msg.HasField("complete"):
                    res.complete = msg.complete
                elif msg.HasField("error"):
                    res.error = msg.error
        except grpc.RpcError as e:
            res.code, res.details = e.code(), e.details() or ""
    return res


def raw_generate(address, payload, timeout=10.0):
    """Sends raw bytes as a GenerateRequest (to test what protobuf itself would refuse)."""
    with cl.channel(address) as ch:
        call = ch.unary_stream("/tinyserve.v1.TinyServe/Generate",
                               request_serializer=lambda b: b,
                               response_deserializer=lambda b: b)(payload, timeout=timeout)
        try:
            list(call)
            return grpc.StatusCode.OK, ""
        except grpc.RpcError as e:
            return e.code(), e.details() or ""


PROMPTS = [f"Once upon a time there was a {w}" for w in (
    "cat", "dog", "bird", "girl", "boy", "king", "queen", "tree", "fish", "frog", "car", "ball",
    "sun", "moon", "star", "bear", "duck", "cow", "pig", "horse", "lion", "mouse", "bee", "ant",
    "owl", "fox", "wolf", "deer", "goat", "sheep", "hen", "crab")]


class ClusterTest(cl.ClusterCase):

    # (a)
    def test_stream_through_router(self):
        w = self.cluster.worker()
        r = self.cluster.router([w])
        res = generate(r.address, request("Once upon a time", max_tokens=16))
        self.assertEqual(res.code, grpc.StatusCode.OK, res.details)
        self.assertIsNotNone(res.complete)
        self.assertGreater(res.chunks, 0)
        self.assertGreater(len(res.ids), 0)
        self.assertLessEqual(res.complete.usage.completion_tokens, 16)
        self.assertEqual(res.complete.usage.completion_tokens, len(res.ids))
        self.assertEqual(res.complete.worker, w.address)
        self.assertTrue(res.text)
        with cl.channel(r.address) as ch:
            stub = S.grpc.TinyServeStub(ch)
            info = stub.GetModelInfo(S.pb.GetModelInfoRequest(), timeout=5)
            self.assertGreater(info.vocab_size, 0)
            tok = stub.Tokenize(S.pb.TokenizeRequest(text="Once upon a time"), timeout=5)
            self.assertGreater(len(tok.token_ids), 0)
            detok = stub.Detokenize(S.pb.DetokenizeRequest(token_ids=res.ids), timeout=5)
            self.assertTrue(detok.text)
            sinfo = stub.GetServerInfo(S.pb.GetServerInfoRequest(), timeout=5)
            self.assertEqual(sinfo.role, "router")
            self.assertTrue(sinfo.ready)
            self.assertEqual(len(sinfo.workers), 1)

    # (b)
    def test_two_workers_concurrent_streams(self):
        w1, w2 = self.cluster.worker(), self.cluster.worker()
        r = self.cluster.router([w1, w2])
        reqs = [request(p, max_tokens=24) for p in PROMPTS]
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            results = list(pool.map(lambda q: generate(r.address, q, timeout=60), reqs))
        for i, res in enumerate(results):
            self.assertEqual(res.code, grpc.StatusCode.OK, f"stream {i}: {res.details}")
            self.assertIsNotNone(res.complete, f"stream {i}")
        text = r.metrics()
        for w in (w1, w2):
            ok = cl.metric(text, "tinyserve_router_requests_total", worker=w.address,
                           outcome="ok")
            self.assertTrue(ok and ok > 0, f"no requests reached {w.address}")
        # Greedy output does not depend on the batch: each equals the request alone.
        for i in (0, 7, 19, 31):
            alone = generate(w1.address, reqs[i], timeout=30)
            self.assertEqual(alone.code, grpc.StatusCode.OK, alone.details)
            self.assertEqual(alone.ids, results[i].ids, f"stream {i} differs when alone")

    # (c)
    def test_worker_killed_under_load(self):
        w1, w2 = self.cluster.worker(), self.cluster.worker()
        r = self.cluster.router([w1, w2], "--policy", "round_robin", "--breaker-cooldown", "1")
        deadline = 30.0
        reqs = [request(p, max_tokens=400, ignore_eos=True) for p in PROMPTS[:16]]
        started = time.time()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            futures = [pool.submit(generate, r.address, q, deadline) for q in reqs]
            time.sleep(0.1)
            w1.kill(signal.SIGKILL)
            results = [f.result(timeout=deadline + 15) for f in futures]
        self.assertLess(time.time() - started, deadline + 10, "a request hung")
        for i, res in enumerate(results):
            self.assertIn(res.code, (grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE),
                          f"stream {i}: {res.code} {res.details}")
            if res.code == grpc.StatusCode.OK:  # finished before the kill, or on the survivor
                self.assertIsNotNone(res.complete, f"stream {i}")
        healthy = lambda: cl.metric(r.metrics(), "tinyserve_router_worker_healthy",
                                    worker=w1.address)
        self.assertTrue(cl.wait_for(lambda: healthy() == 0, 10), "router still marks it up")
        # New requests all go to the survivor meanwhile.
        res = generate(r.address, request("Once upon a time", max_tokens=8))
        self.assertEqual(res.code, grpc.StatusCode.OK, res.details)
        self.assertEqual(res.complete.worker, w2.address)
        # Restart on the same port: the router takes it back.
        w1.start()
        w1.wait_ready()
        self.assertTrue(cl.wait_for(lambda: healthy() == 1, 20), "router did not take it back")
        served_by = lambda: generate(r.address, request("Once upon a time", max_tokens=4))
        self.assertTrue(cl.wait_for(lambda: served_by().complete.worker == w1.address, 10),
                        "no request reached the restarted worker")

    def test_worker_of_another_model_gets_no_requests(self):
        """Workers report their model's identity (served name and a digest of shape and
        vocabulary); the router routes to the one most live workers serve. A worker started with
        another model gets no requests, and once most serve the other (a rolling update: the
        old ones leave) the router switches to it."""
        a1, a2 = self.cluster.worker(), self.cluster.worker()
        # (Its name not UTF-8, as a GGUF's general.name or a path may be: the identity is.)
        b = self.cluster.worker("--served-model-name", "other-model-\udcff")
        r = self.cluster.router([a1, a2, b], "--policy", "round_robin")
        mismatch = lambda w: cl.metric(r.metrics(), "tinyserve_router_worker_model_mismatch",
                                       worker=w.address)
        self.assertTrue(cl.wait_for(lambda: mismatch(b) == 1, 10), "mismatch not noticed")
        self.assertEqual((mismatch(a1), mismatch(a2)), (0, 0))
        for i in range(6):
            res = generate(r.address, request(PROMPTS[i], max_tokens=2))
            self.assertEqual(res.code, grpc.StatusCode.OK, res.details)
            self.assertIn(res.complete.worker, (a1.address, a2.address))
        with cl.channel(r.address) as ch:
            stub = S.grpc.TinyServeStub(ch)
            workers = {w.address: w for w in stub.GetServerInfo(
                S.pb.GetServerInfoRequest(), timeout=5).workers}
            self.assertTrue(workers[b.address].model_mismatch)
            self.assertFalse(workers[b.address].healthy)
            self.assertTrue(workers[b.address].model.startswith("other-model-\ufffd#"),
                            workers[b.address].model)
            self.assertEqual(workers[a1.address].model, workers[a2.address].model)
            self.assertNotEqual(workers[a1.address].model, workers[b.address].model)
            self.assertFalse(workers[a1.address].model_mismatch)
            info = stub.GetModelInfo(S.pb.GetModelInfoRequest(), timeout=5)
            self.assertFalse(info.name.startswith("other-model"))
        with open(os.path.join(self.cluster.log_dir, f"router-{r.port}.log")) as f:
            self.assertIn(f"worker {b.address} serves model other-model-\ufffd#", f.read())
        # The old model's workers leave (drained): the router switches to the other.
        a1.stop()
        a2.stop()
        served_by_b = lambda: generate(r.address, request("Once upon a time", max_tokens=2))
        self.assertTrue(cl.wait_for(
            lambda: (lambda res: res.complete is not None and res.complete.worker == b.address)(
                served_by_b()), 15), "the router did not switch to the remaining model")
        self.assertEqual(mismatch(b), 0)

    def test_worker_lost_mid_stream_migrates(self):
        """A worker killed (SIGKILL) or drained (SIGTERM past its drain timeout) mid-stream: the
        router continues the stream on the other worker from the tokens already sent, and the
        client sees one whole stream. SmolLM2 (the default model) decodes slowly enough here to
        act mid-stream."""
        model = cl.smollm2_model(self)
        for how in (signal.SIGKILL, signal.SIGTERM):
            w1 = self.cluster.worker("--model", model, "--drain-timeout", "0.3")
            w2 = self.cluster.worker("--model", model, "--drain-timeout", "0.3")
            r = self.cluster.router([w1, w2])
            # Long enough that the 0.3 s drain cannot finish it (about 2 s of decode are left
            # at the kill): it must move.
            q = request("Once upon a time", max_tokens=480, ignore_eos=True)
            q.sampling.stop.append("zzzz")  # keeps a held-back tail in play
            out = {}
            t = threading.Thread(target=lambda: out.update(res=generate(r.address, q, 120)))
            t.start()
            inflight = lambda w: cl.metric(r.metrics(), "tinyserve_router_worker_inflight",
                                           worker=w.address) or 0
            serving = None
            deadline = time.time() + 30
            while serving is None and time.time() < deadline:
                serving = next((w for w in (w1, w2) if inflight(w) > 0), None)
                time.sleep(0.02)
            self.assertIsNotNone(serving, "the stream never started")
            # Some tokens out (a kill before the first would be a retry, not a migration).
            self.assertTrue(cl.wait_for(lambda: (cl.metric(
                r.metrics(), "tinyserve_router_time_to_first_token_seconds_count") or 0) >= 1, 30))
            serving.kill(how)
            t.join(120)
            res = out["res"]
            self.assertEqual(res.code, grpc.StatusCode.OK, f"{how}: {res.code} {res.details}")
            self.assertEqual(res.complete.finish_reason, S.pb.FINISH_REASON_LENGTH, how)
            self.assertEqual(len(res.ids), 480, how)
            self.assertEqual(res.complete.usage.completion_tokens, 480, how)
            survivor = w2 if serving is w1 else w1
            self.assertEqual(res.complete.worker, survivor.address, how)
            self.assertEqual(cl.metric(r.metrics(), "tinyserve_router_migrations_total"), 1, how)
            # No text lost or repeated where the stream moved: it is the text of its ids.
            detok = S.grpc.TinyServeStub(cl.channel(r.address)).Detokenize(
                S.pb.DetokenizeRequest(token_ids=res.ids), timeout=10)
            self.assertEqual(res.text, detok.text, how)
            for p in (w1, w2, r):
                p.kill(signal.SIGKILL)

    # (d)
    def test_cancel_and_deadline_free_pages(self):
        w = self.cluster.worker()
        r = self.cluster.router([w])
        used = lambda: cl.metric(w.metrics(), "tinyserve_kv_pages_used")
        baseline = used()
        self.assertIsNotNone(baseline)
        for address in (w.address, r.address):
            res = generate(address, request("Once upon a time", max_tokens=400, ignore_eos=True),
                           cancel_after=2)
            self.assertEqual(res.code, grpc.StatusCode.CANCELLED, res.details)
            res = generate(address, request("Once upon a time", max_tokens=400, ignore_eos=True),
                           timeout=0.05)
            self.assertIn(res.code, (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.OK))
        self.assertTrue(cl.wait_for(lambda: used() == baseline, 10),
                        f"kv pages used {used()} != baseline {baseline}")
        self.assertTrue(cl.wait_for(
            lambda: (cl.metric(w.metrics(), "tinyserve_requests_running") or 0) == 0, 10))
        text = w.metrics()
        self.assertGreater(cl.metric(text, "tinyserve_requests_total", outcome="abort") or 0, 0)
        # Abort by id through the router.
        rid = "abort-me"
        q = request("Once upon a time", max_tokens=400, ignore_eos=True)
        q.request_id = rid
        out = {}
        t = threading.Thread(target=lambda: out.update(res=generate(r.address, q)))
        t.start()
        aborted = cl.wait_for(lambda: list(S.grpc.TinyServeStub(cl.channel(r.address)).Abort(
            S.pb.AbortRequest(request_ids=[rid]), timeout=5).aborted), 5, 0.01)
        t.join(30)
        self.assertFalse(t.is_alive())
        self.assertEqual(out["res"].code, grpc.StatusCode.OK, out["res"].details)
        if aborted:
            # Aborted, unless the abort landed in the step that finished it anyway.
            self.assertIn(out["res"].complete.finish_reason,
                          (S.pb.FINISH_REASON_ABORT, S.pb.FINISH_REASON_LENGTH))
            if out["res"].complete.finish_reason == S.pb.FINISH_REASON_LENGTH:
                self.assertEqual(out["res"].complete.usage.completion_tokens, 400)
        self.assertTrue(cl.wait_for(lambda: used() == baseline, 10))
        # Only live ids come back: the finished one and an unknown one are not echoed.
        none = S.grpc.TinyServeStub(cl.channel(r.address)).Abort(
            S.pb.AbortRequest(request_ids=[rid, "no-such-id"]), timeout=5)
        self.assertEqual(list(none.aborted), [])

    # (e)
    def test_bad_requests(self):
        w = self.cluster.worker()
        r = self.cluster.router([w])
        info = S.grpc.TinyServeStub(cl.channel(w.address)).GetModelInfo(
            S.pb.GetModelInfoRequest(), timeout=5)
        cases = [
            ("no prompt", S.pb.GenerateRequest(), "prompt"),
            ("empty text", request(""), "prompt"),
            ("too long", request(ids=[1] * (info.max_context + 10)), "prompt"),
            ("id outside vocab", request(ids=[info.vocab_size + 5]), "token_ids"),
            ("temperature", request("hi", temperature=-1.0), "temperature"),
            ("top_p", request("hi", top_p=1.5), "top_p"),
            ("top_k", request("hi", top_k=-3), "top_k"),
            ("huge max_tokens", request("hi", max_tokens=10**9), "max_tokens"),
        ]
        bad_policy = request("hi")
        bad_policy.selection.policy = "no_such_policy"
        cases.append(("unknown policy", bad_policy, "policy"))
        for bad_id in ("__probe1", "__embed/x/0", "x" * 257):  # reserved, too long
            q = request("hi")
            q.request_id = bad_id
            cases.append((f"request_id {bad_id[:12]}", q, "request_id"))
        for address in (w.address, r.address):
            for name, q, field in cases:
                res = generate(address, q, timeout=10)
                self.assertEqual(res.code, grpc.StatusCode.INVALID_ARGUMENT,
                                 f"{name} via {address}: {res.code} {res.details}")
                self.assertIn(field, res.details, f"{name}: message does not name {field}")
            # Malformed UTF-8: field 2 (text), 3 bytes, not UTF-8.
            code, details = raw_generate(address, b"\x12\x03\xff\xfe\xfd")
            self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, details)
            self.assertIn("text", details)
            # Oversized: over the 4 MiB receive limit.
            res = generate(address, request("a" * (5 << 20)), timeout=20)
            self.assertEqual(res.code, grpc.StatusCode.RESOURCE_EXHAUSTED, res.details)
            # Still serving.
            res = generate(address, request("Once upon a time", max_tokens=4))
            self.assertEqual(res.code, grpc.StatusCode.OK, res.details)
        self.assertTrue(w.alive() and r.alive())
        self.assertGreater(cl.metric(w.metrics(), "tinyserve_requests_total",
                                     outcome="invalid") or 0, 0)

    # (f)
    def test_full_queue_rejects(self):
        w = self.cluster.worker("--max-queue", "1", "--max-batch", "1")
        r = self.cluster.router([w])
        for address in (w.address, r.address):
            reqs = [request(p, max_tokens=300, ignore_eos=True) for p in PROMPTS[:12]]
            with concurrent.futures.ThreadPoolExecutor(12) as pool:
                results = list(pool.map(lambda q: generate(address, q, timeout=60), reqs))
            codes = [res.code for res in results]
            self.assertIn(grpc.StatusCode.RESOURCE_EXHAUSTED, codes, f"via {address}")
            self.assertIn(grpc.StatusCode.OK, codes, f"via {address}")
            self.assertTrue(set(codes) <= {grpc.StatusCode.OK,
                                           grpc.StatusCode.RESOURCE_EXHAUSTED}, codes)
        self.assertGreater(cl.metric(w.metrics(), "tinyserve_requests_total",
                                     outcome="rejected") or 0, 0)
        self.assertGreater(cl.metric(r.metrics(), "tinyserve_router_requests_total",
                                     outcome="rejected") or 0, 0)

    # (g)
    def test_shared_prefix_cache_aware(self):
        w1, w2 = self.cluster.worker(), self.cluster.worker()
        r = self.cluster.router([w1, w2], "--policy", "cache_aware")
        prefix = ("Once upon a time there was a little girl named Lily. She loved to play in "
                  "the park with her friends. One day she found a big red ball under a tree. ")
        prefix = prefix * 3
        workers, cached = [], []
        for i, tail in enumerate(["She was happy.", "He was sad.", "They ran home.",
                                  "The sun was hot.", "A dog barked.", "It began to rain."]):
            res = generate(r.address, request(prefix + tail, max_tokens=4))
            self.assertEqual(res.code, grpc.StatusCode.OK, res.details)
            workers.append(res.complete.worker)
            cached.append(res.complete.usage.cached_tokens)
        self.assertEqual(len(set(workers[1:])), 1, f"prefix requests spread: {workers}")
        self.assertGreater(max(cached[1:]), 0, f"no cached tokens: {cached}")
        target = w1 if workers[-1] == w1.address else w2
        self.assertGreater(cl.metric(target.metrics(),
                                     "tinyserve_prefix_cache_hits_tokens_total") or 0, 0)
        self.assertGreater(cl.metric(r.metrics(), "tinyserve_router_routing_decisions_total",
                                     reason="prefix_hit") or 0, 0)

    # Speculative decoding on a worker: the same tokens as a plain worker, drafts counted.
    def test_speculative_worker_matches_plain(self):
        plain = self.cluster.worker()
        spec = self.cluster.worker("--spec-tokens=6", "--spec-ngram-min=1")
        r = self.cluster.router([spec])
        accepted_in_usage = 0
        for p in PROMPTS[:4]:
            q = request(p, max_tokens=80, ignore_eos=True)
            a, b = generate(plain.address, q), generate(r.address, q)
            self.assertEqual(a.code, grpc.StatusCode.OK, a.details)
            self.assertEqual(b.code, grpc.StatusCode.OK, b.details)
            self.assertEqual(b.ids, a.ids, p)
            self.assertEqual(b.text, a.text, p)
            self.assertEqual(b.complete.usage.completion_tokens, 80)
            self.assertLessEqual(b.complete.usage.spec_accepted_tokens,
                                 b.complete.usage.spec_draft_tokens)
            self.assertEqual(a.complete.usage.spec_draft_tokens, 0)
            accepted_in_usage += b.complete.usage.spec_accepted_tokens
        text = spec.metrics()
        drafted = cl.metric(text, "tinyserve_spec_decode_draft_tokens_total") or 0
        accepted = cl.metric(text, "tinyserve_spec_decode_accepted_tokens_total") or 0
        self.assertGreater(cl.metric(text, "tinyserve_spec_decode_drafts_total") or 0, 0)
        self.assertGreater(accepted, 0)
        self.assertLessEqual(accepted, drafted)
        self.assertEqual(accepted, accepted_in_usage)  # the requests' usage adds up to the counter
        self.assertTrue(cl.wait_for(
            lambda: cl.metric(spec.metrics(), "tinyserve_kv_pages_used") == 0, 10),
            "KV pages still held after the streams ended")
        self.assertEqual(cl.metric(plain.metrics(), "tinyserve_spec_decode_draft_tokens_total"), 0)

    # (h)
    def test_promtool_checks_live_scrapes(self):
        promtool = "/usr/bin/promtool"
        if not os.path.exists(promtool):
            self.skipTest("promtool not installed")
        w = self.cluster.worker()
        r = self.cluster.router([w])
        for p in PROMPTS[:4]:
            generate(r.address, request(p, max_tokens=8))
        generate(r.address, S.pb.GenerateRequest())  # an invalid one too
        known = set()  # promtool's lint must find nothing
        for name, text in (("worker", w.metrics()), ("router", r.metrics())):
            proc = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                                  capture_output=True, timeout=30)
            out = (proc.stdout + proc.stderr).decode()
            findings = {line.strip() for line in out.splitlines() if line.strip()}
            # 0: clean; 3: lint findings only (1 would be a parse error).
            self.assertIn(proc.returncode, (0, 3), f"{name}: {out}")
            self.assertTrue(findings <= known, f"{name}: {findings - known}")
        for name in ("tinyserve_requests_total", "tinyserve_kv_pages_capacity",
                     "tinyserve_time_to_first_token_seconds_bucket", "tinyserve_build_info",
                     "tinyserve_worker_ready"):
            self.assertIsNotNone(cl.metric(w.metrics(), name), name)
        for name in ("tinyserve_router_requests_total", "tinyserve_router_worker_healthy",
                     "tinyserve_router_workers", "tinyserve_build_info"):
            self.assertIsNotNone(cl.metric(r.metrics(), name), name)

    def test_ipv6_loopback(self):
        """A worker and a router on ::1 (gRPC takes bracketed IPv6 literals: [::1]:port)."""
        import socket
        try:
            with socket.socket(socket.AF_INET6) as s:
                s.bind(("::1", 0))
        except OSError:
            self.skipTest("no IPv6 loopback")

        def proc(role, port, args):
            p = cl.Proc(self.cluster.binary, role, ["--host", "::1", "--port", str(port),
                                                    "--metrics-port", "0"] + args,
                        port, None, self.cluster.log_dir)
            p.address = f"[::1]:{port}"
            self.cluster.procs.append(p)
            return p
        wport, rport = cl.free_port(), cl.free_port()
        w = proc("worker", wport, ["--model", self.cluster.model])
        w.wait_ready()
        r = proc("router", rport, ["--http-port", "0", "--workers", f"[::1]:{wport}",
                                   "--health-interval", "0.2"])
        r.wait_ready()
        res = generate(r.address, request("Once upon a time", max_tokens=8))
        self.assertEqual(res.code, grpc.StatusCode.OK, res.details)
        self.assertEqual(res.complete.worker, f"[::1]:{wport}")
        self.assertEqual(res.ids, generate(w.address, request("Once upon a time",
                                                              max_tokens=8)).ids)

    def test_sigterm_drains_and_exits_zero(self):
        w = self.cluster.worker()
        out = {}
        t = threading.Thread(target=lambda: out.update(
            res=generate(w.address, request("Once upon a time", max_tokens=200,
                                            ignore_eos=True))))
        t.start()
        time.sleep(0.05)
        w.kill(signal.SIGTERM)
        self.assertEqual(w.wait(timeout=20), 0)
        t.join(20)
        self.assertIn(out["res"].code, (grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE))


if __name__ == "__main__":
    S = cl.stubs()
    sys.exit(cl.run_tests())
