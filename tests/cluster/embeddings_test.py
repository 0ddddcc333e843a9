"""Embeddings: the Embed RPC and POST /v1/embeddings, through a router to a worker.

  python embeddings_test.py --binary build/bin/tinyserve [unittest args]

Cases:
  matches_llama_cpp   SmolLM2-135M-Instruct: last and mean pooling of four texts (one of 807
                      tokens, over many prefill chunks) match llama.cpp's embeddings
                      (tests/golden/smollm2/embeddings.json, scripts/make_embedding_goldens.py):
                      cosine >= 0.998 and relative L2 error <= 0.06 unnormalized over gRPC, each
                      nearer its own golden than any other text's; the official `openai` client
                      gets unit vectors (base64 by default) equal to "float"'s, token counts
                      from the same tokenization; generation runs beside embeddings; 2048
                      inputs in one HTTP call (a response over gRPC's default 4 MiB)
  drain_and_cancel    stories260K: SIGTERM in the middle of a long call lets it finish (every
                      input embedded, exit 0); a client that cancels a call through the router
                      stops the worker's inputs (nothing left running long before the call
                      could have ended); Abort with the call's id ends it (CANCELLED); the
                      router admits calls (--max-inflight 1 --max-queue 1: one queued, the next
                      RESOURCE_EXHAUSTED; a cancelled queued call leaves the queue) and its
                      drain lets the running call finish
  bad_requests        stories260K: each bad request is INVALID_ARGUMENT (HTTP 400) naming the
                      field, including malformed UTF-8 in one input; a call of 300 inputs on a
                      worker whose batch is 4 and queue 2 succeeds; a deadline ends a long call
                      with DEADLINE_EXCEEDED; no KV page is left used and the worker still serves
"""
import base64
import concurrent.futures
import json
import os
import signal
import struct
import sys
import threading
import time

import grpc
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cluster_lib as cl  # noqa: E402
import cluster_test as ct  # noqa: E402  (request/generate helpers)
from openai_http_test import client, post  # noqa: E402

GOLDEN = os.path.join(HERE, "..", "golden", "smollm2", "embeddings.json")


def cosine(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def embed(address, req, timeout=120):
    S = cl.stubs()
    with cl.channel(address) as ch:
        return S.grpc.TinyServeStub(ch).Embed(req, timeout=timeout)


def rpc_error(address, req, timeout=60):
    """(code, details) of an Embed call that is expected to fail."""
    try:
        embed(address, req, timeout)
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details() or ""


class EmbeddingsTest(cl.ClusterCase):

    def test_matches_llama_cpp(self):
        S = ct.S = cl.stubs()
        model = cl.smollm2_model(self)
        with open(GOLDEN) as f:
            golden = json.load(f)
        texts = golden["texts"]
        w = self.cluster.worker("--model", model, "--max-step-tokens", "64", "--max-batch", "4")
        r = self.cluster.router([w])

        report = {}
        for pooling, key in ((S.pb.POOLING_LAST, "last"), (S.pb.POOLING_MEAN, "mean")):
            req = S.pb.EmbedRequest(pooling=pooling, inputs=[
                S.pb.EmbedInput(token_ids=S.pb.TokenIds(ids=t["ids"])) for t in texts])
            resp = embed(r.address, req)
            self.assertEqual(len(resp.embeddings), len(texts))
            self.assertEqual(resp.prompt_tokens, sum(len(t["ids"]) for t in texts))
            for i, (t, e) in enumerate(zip(texts, resp.embeddings)):
                got, want = np.array(e.values), np.array(t[key])
                self.assertEqual(got.shape, want.shape)
                self.assertEqual(e.prompt_tokens, len(t["ids"]))
                cos = cosine(got, want)
                rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
                nearest = max(cosine(got, o[key]) for o in texts if o is not t)
                report[f"{key}[{i}]"] = {"cosine": round(cos, 5), "rel_l2": round(rel, 4),
                                         "next_nearest": round(nearest, 3)}
                self.assertGreaterEqual(cos, 0.998, f"{key} text {i}")
                self.assertLessEqual(rel, 0.06, f"{key} text {i}")
                self.assertLess(nearest, cos - 0.1, f"{key} text {i}")
        print(json.dumps(report))

        # OpenAI's client: text in, unit vectors out (it asks for base64 and decodes it).
        oc = client(r.http_port)
        out = oc.embeddings.create(model="m", input=[t["text"] for t in texts])
        self.assertEqual(out.usage.prompt_tokens, sum(len(t["ids"]) for t in texts))
        self.assertEqual([d.index for d in out.data], list(range(len(texts))))
        for t, d in zip(texts, out.data):
            v = np.array(d.embedding)
            self.assertAlmostEqual(float(np.linalg.norm(v)), 1.0, places=4)
            self.assertGreaterEqual(cosine(v, t["last"]), 0.998)
        # "float" gives the numbers base64 encodes (the same input alone, twice: the same batch
        # shape); "mean" and unnormalized are passed on.
        alone = oc.embeddings.create(model="m", input=texts[0]["text"])
        status, body = post(r.http_port, "/v1/embeddings",
                            {"input": texts[0]["text"], "encoding_format": "float"})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["object"], "list")
        self.assertEqual(body["data"][0]["object"], "embedding")
        np.testing.assert_allclose(body["data"][0]["embedding"], alone.data[0].embedding,
                                   rtol=1e-6)
        status, body = post(r.http_port, "/v1/embeddings", {
            "input": [texts[1]["ids"]], "encoding_format": "base64", "pooling": "mean",
            "normalize": False})
        self.assertEqual(status, 200, body)
        raw = base64.b64decode(body["data"][0]["embedding"])
        v = struct.unpack(f"<{len(raw) // 4}f", raw)
        self.assertGreaterEqual(cosine(v, texts[1]["mean"]), 0.998)
        self.assertLessEqual(np.linalg.norm(np.array(v) - texts[1]["mean"]) /
                             np.linalg.norm(texts[1]["mean"]), 0.06)

        # Generation beside embeddings: both complete.
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            gen = pool.submit(ct.generate, r.address, ct.request("Once upon a time", max_tokens=32),
                              60)
            embs = [pool.submit(embed, r.address, S.pb.EmbedRequest(inputs=[
                S.pb.EmbedInput(text=t["text"]) for t in texts])) for _ in range(3)]
            self.assertEqual(gen.result().code, grpc.StatusCode.OK)
            for f in embs:
                self.assertEqual(len(f.result().embeddings), len(texts))
        self.assertGreaterEqual(cl.metric(r.metrics(), "tinyserve_http_requests_total",
                                          route="embeddings", code="200") or 0, 3)
        # Every input embedded so far: 2 x 4 (gRPC), 4 + 1 + 1 + 1 (HTTP), 3 x 4 (beside
        # generation).
        self.assertEqual(cl.metric(w.metrics(), "tinyserve_embedding_inputs_total"), 27)

        # The most inputs a call takes: 2048 x 576 floats, over gRPC's default message limit.
        words = [f"word {i}" for i in range(2048)]
        status, body = post(r.http_port, "/v1/embeddings",
                            {"input": words, "encoding_format": "base64"}, timeout=300)
        self.assertEqual(status, 200, str(body)[:300])
        self.assertEqual(len(body["data"]), 2048)
        self.assertEqual(len(base64.b64decode(body["data"][-1]["embedding"])), 576 * 4)

    def test_drain_and_cancel(self):
        S = ct.S = cl.stubs()
        # One input at a time, in chunks of 16 tokens, no prefix cache: a call of many long
        # inputs takes seconds.
        many = S.pb.EmbedRequest(inputs=[S.pb.EmbedInput(text="Once upon a time " * 80 + str(i))
                                         for i in range(300)])
        w = self.cluster.worker("--max-batch", "1", "--max-step-tokens", "16", "--no-prefix-caching",
                                "--drain-timeout", "120")
        out = {}

        def call():
            start = time.monotonic()
            out["resp"] = embed(w.address, many, timeout=120)
            out["seconds"], out["end"] = time.monotonic() - start, time.monotonic()
        t = threading.Thread(target=call)
        t.start()
        self.assertTrue(cl.wait_for(  # the call is running on the worker
            lambda: (w.server_info() or S.pb.ServerInfo()).running > 0, 30))
        w.kill(signal.SIGTERM)
        sigterm = time.monotonic()
        t.join(120)
        self.assertIn("resp", out, "the call failed under the drain")
        self.assertEqual(len(out["resp"].embeddings), 300)
        self.assertGreater(out["end"] - sigterm, 0.5, "the call ended before the drain began")
        self.assertEqual(w.wait(timeout=30), 0)
        whole = out["seconds"]

        w = self.cluster.worker("--max-batch", "1", "--max-step-tokens", "16", "--no-prefix-caching")
        r = self.cluster.router([w])
        with cl.channel(r.address) as ch:
            call = S.grpc.TinyServeStub(ch).Embed.future(many, timeout=120)
            time.sleep(0.3)
            call.cancel()
            cancelled = time.monotonic()

            def stopped():
                info = w.server_info()
                return info is not None and info.running == 0 and info.kv_pages_used == 0
            self.assertTrue(cl.wait_for(stopped, 30), w.server_info())
            self.assertLess(time.monotonic() - cancelled, whole / 2,
                            "the worker kept embedding after the client cancelled")

            # Abort by the call's id (through the router, which asks every worker) ends it.
            stub = S.grpc.TinyServeStub(ch)
            named = S.pb.EmbedRequest()
            named.CopyFrom(many)
            named.request_id = "embed-call-1"
            call = stub.Embed.future(named, timeout=120)
            self.assertTrue(cl.wait_for(
                lambda: (w.server_info() or S.pb.ServerInfo()).running > 0, 10))
            aborted = stub.Abort(S.pb.AbortRequest(request_ids=["embed-call-1"]), timeout=10)
            self.assertEqual(list(aborted.aborted), ["embed-call-1"])
            with self.assertRaises(grpc.RpcError) as e:
                call.result()
            self.assertEqual(e.exception.code(), grpc.StatusCode.CANCELLED)
            self.assertTrue(cl.wait_for(stopped, 30), w.server_info())

        # The router admits Embed calls as it admits Generate calls: one at a time here, one
        # more queued, the next refused; a queued call the client cancels leaves the queue; a
        # router drain lets the running call finish.
        w = self.cluster.worker("--max-batch", "1", "--max-step-tokens", "16", "--no-prefix-caching")
        r = self.cluster.router([w], "--max-inflight", "1", "--max-queue", "1",
                                "--drain-timeout", "120")
        short = S.pb.EmbedRequest(inputs=[S.pb.EmbedInput(text="Hello")])

        def waiting():
            return cl.metric(r.metrics(), "tinyserve_router_requests_waiting")
        with cl.channel(r.address) as ch:
            stub = S.grpc.TinyServeStub(ch)
            running = stub.Embed.future(many, timeout=120)
            self.assertTrue(cl.wait_for(
                lambda: (w.server_info() or S.pb.ServerInfo()).running > 0, 10))
            queued = stub.Embed.future(short, timeout=120)
            self.assertTrue(cl.wait_for(lambda: waiting() == 1, 10), waiting())
            with self.assertRaises(grpc.RpcError) as e:
                stub.Embed(short, timeout=10)
            self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
            self.assertIn("router queue is full", e.exception.details())
            queued.cancel()
            self.assertTrue(cl.wait_for(lambda: waiting() == 0, 10), waiting())
            self.assertFalse(running.done())
            r.kill(signal.SIGTERM)
            self.assertEqual(len(running.result(timeout=120).embeddings), 300)
        self.assertEqual(r.wait(timeout=30), 0)

    def test_bad_requests(self):
        S = ct.S = cl.stubs()
        w = self.cluster.worker("--max-batch", "4", "--max-queue", "2")
        r = self.cluster.router([w])

        def bad_http(body, field):
            status, out = post(r.http_port, "/v1/embeddings", body)
            self.assertEqual(status, 400, f"{body}: {out}")
            self.assertIn(field, out["error"]["message"], body)
            self.assertEqual(out["error"]["param"], field, body)

        bad_http({}, "input")
        bad_http({"input": []}, "input")
        bad_http({"input": ""}, "input")
        bad_http({"input": ["a", ""]}, "input[1]")
        bad_http({"input": [[1, 2], [-1]]}, "input[1]")
        bad_http({"input": 5}, "input")
        bad_http({"input": "a", "encoding_format": "int8"}, "encoding_format")
        bad_http({"input": "a", "dimensions": 8}, "dimensions")
        bad_http({"input": "a", "pooling": "cls"}, "pooling")
        bad_http({"input": "a", "normalize": "yes"}, "normalize")
        bad_http({"input": ["a", "x" * 3000]}, "input[1]")  # past the 512-token context
        bad_http({"input": [[1, 100000]]}, "input[0][1]")

        def bad_rpc(req, field):
            code, details = rpc_error(r.address, req)
            self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, f"{req}: {details}")
            self.assertIn(field, details)

        text = S.pb.EmbedInput(text="Once upon a time")
        bad_rpc(S.pb.EmbedRequest(), "inputs")
        bad_rpc(S.pb.EmbedRequest(inputs=[text] * 2049), "inputs")
        bad_rpc(S.pb.EmbedRequest(inputs=[text, S.pb.EmbedInput()]), "inputs[1]")
        bad_rpc(S.pb.EmbedRequest(inputs=[text], lora_adapter="nope"), "lora_adapter")
        bad_rpc(S.pb.EmbedRequest(inputs=[text], pooling=7), "pooling")
        # Malformed UTF-8 in the second input's text (field 2, EmbedInput field 1), which
        # protobuf itself refuses to parse: named, on the router and on the worker.
        payload = b"\x12\x04\x0a\x02hi" + b"\x12\x04\x0a\x02\xff\xfe"
        for address in (r.address, w.address):
            with cl.channel(address) as ch:
                call = ch.unary_unary("/tinyserve.v1.TinyServe/Embed",
                                      request_serializer=lambda b: b,
                                      response_deserializer=lambda b: b)
                with self.assertRaises(grpc.RpcError) as e:
                    call(payload, timeout=10)
                self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
                self.assertIn("inputs[1].text", e.exception.details())

        # More inputs than the batch and the queue together: run a window at a time.
        many = [S.pb.EmbedInput(text=f"Once upon a time there was a number {i}")
                for i in range(300)]
        resp = embed(r.address, S.pb.EmbedRequest(inputs=many, normalize=True))
        self.assertEqual(len(resp.embeddings), 300)
        for e in resp.embeddings:
            self.assertAlmostEqual(float(np.linalg.norm(e.values)), 1.0, places=4)
        self.assertGreater(cosine(resp.embeddings[0].values, resp.embeddings[1].values), 0.5)
        self.assertLess(cosine(resp.embeddings[0].values, resp.embeddings[1].values), 0.99999)

        # A deadline ends a long call; its running inputs are aborted and free their pages.
        long_inputs = [S.pb.EmbedInput(text="Once upon a time " * 60 + str(i))
                       for i in range(2000)]
        code, _ = rpc_error(r.address, S.pb.EmbedRequest(inputs=long_inputs), timeout=0.5)
        self.assertEqual(code, grpc.StatusCode.DEADLINE_EXCEEDED)

        def idle():
            info = w.server_info()
            return info is not None and info.running == 0 and info.kv_pages_used == 0
        self.assertTrue(cl.wait_for(idle, 30), w.server_info())
        res = ct.generate(r.address, ct.request("Once upon a time", max_tokens=8), 30)
        self.assertEqual(res.code, grpc.StatusCode.OK, res.details)


if __name__ == "__main__":
    cl.run_tests()
