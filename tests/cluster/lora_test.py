"""Multi-LoRA serving: a worker started with `--lora NAME=PATH` adapters, behind a router.

  python lora_test.py --binary build/bin/tinyserve [unittest args]

Cases:
  matches_llama_cpp   SmolLM2-135M-Instruct with two random adapters (scripts/make_lora_adapter.py,
                      byte-identical to the ones scripts/make_lora_goldens.py gave llama.cpp):
                      /v1/models lists them with the base as parent; prompt logprobs per adapter
                      (HTTP, "model": NAME) and greedy tokens (gRPC lora_adapter, base and both
                      adapters in one batch) match llama.cpp's (tests/golden/smollm2/lora.json);
                      an adapter's prompt does not reuse the base model's cached pages, but
                      its own
  bad_adapters        stories260K: a worker given a missing file, a model instead of an adapter
                      or one name twice exits non-zero naming it; an unknown lora_adapter is
                      INVALID_ARGUMENT naming the field and an unknown "model" a 404 once
                      adapters are loaded (any "model" is served by the base without them);
                      --served-model-name renames the base model
  runtime_load_and_unload
                      stories260K: /v1/load_lora_adapter through a router loads an adapter on
                      both workers (--allow-runtime-lora), which then give the tokens of a
                      worker started with it; refusals name the problem (a name in use, a bad
                      file or name, a worker that does not allow it); unloaded, requests naming
                      it are refused, and it can be loaded again; on SmolLM2, a request running
                      across the unload finishes with the adapter
  adapters_follow_workers
                      stories260K: a request naming an adapter only one worker has (given at
                      start) is routed to that worker, and the router's /v1/models lists it;
                      an adapter loaded through the router is copied onto a worker that
                      restarted (requests naming it succeed meanwhile), and unloaded from one
                      that was unreachable during the unload once it is back; a load through
                      one router replica and an unload through another settle
"""
import concurrent.futures
import hashlib
import json
import os
import signal
import sys
import tempfile
import time
import urllib.request

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import cluster_lib as cl  # noqa: E402
import cluster_test as ct  # noqa: E402  (request/generate helpers)
import golden_compare as gc  # noqa: E402
import make_lora_adapter  # noqa: E402
from openai_http_test import post  # noqa: E402  (raw POST: status, JSON body)

GOLDEN = os.path.join(HERE, "..", "golden", "smollm2", "lora.json")


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
        return json.loads(r.read())


def load_or_unload(port, route, body):
    """A successful /v1/load_lora_adapter or /v1/unload_lora_adapter call: its plain-text
    answer (vLLM's); raises on an HTTP error."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/{route}",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.read().decode()


class LoraTest(cl.ClusterCase):

    def make_adapters(self, model, presets):
        """{preset: path} of freshly generated adapters for `model`."""
        tmp = tempfile.mkdtemp(prefix="tinyserve-lora-")
        out = {}
        for preset in presets:
            out[preset] = os.path.join(tmp, preset + ".gguf")
            make_lora_adapter.write(model, out[preset], preset)
        return out

    def test_matches_llama_cpp(self):
        model = cl.smollm2_model(self)
        with open(GOLDEN) as f:
            golden = json.load(f)
        with open(model, "rb") as f:
            self.assertEqual(hashlib.sha256(f.read()).hexdigest(), golden["model_sha256"])
        paths = self.make_adapters(model, golden["adapters"])
        for name, info in golden["adapters"].items():
            self.assertEqual(make_lora_adapter.sha256(paths[name]), info["sha256"],
                             f"{name}: the generator no longer writes the golden's adapter")
        w = self.cluster.worker("--model", model, "--max-step-tokens", "64",
                                *[a for n, p in sorted(paths.items()) for a in ("--lora", f"{n}={p}")])
        r = self.cluster.router([w])

        models = get(r.http_port, "/v1/models")["data"]
        base_name = models[0]["id"]
        self.assertEqual([m["id"] for m in models], [base_name] + sorted(paths))
        self.assertIsNone(models[0]["parent"])
        for m in models[1:]:
            self.assertEqual(m["parent"], base_name)
            self.assertEqual(m["root"], paths[m["id"]])

        # Prompt logprobs, per adapter, within 0.5 plus llama.cpp's own spread at the position
        # (how far it moves between batch sizes: up to 0.84 here with all-r8).
        report = {name: gc.check_prompt_logprobs(self, r.http_port,
                                                 base_name if name == "base" else name, out, name)
                  for name, out in golden["outputs"].items()}
        print(f"prompt logprobs vs llama.cpp (largest, mean difference): {report}")
        # The adapters change the model: their logprobs are far from the base's.
        for name in golden["adapters"]:
            diffs = [abs(a["logprob"] - b["logprob"])
                     for ta, tb in zip(golden["outputs"][name]["texts"],
                                       golden["outputs"]["base"]["texts"])
                     for a, b in zip(ta["positions"], tb["positions"])]
            self.assertGreater(sum(diffs) / len(diffs), 0.3, name)

        # Greedy tokens, the base and both adapters in flight together (one batch), compared
        # up to llama.cpp's first near tie (a gap under 0.5 between its two best logits).
        def run(item):
            name, g = item
            req = ct.request(ids=g["prompt_ids"], max_tokens=len(g["tokens"]), ignore_eos=True)
            if name != "base":
                req.lora_adapter = name
            return ct.generate(r.address, req, timeout=120)

        items = [(name, g) for name, out in golden["outputs"].items() for g in out["greedy"]]
        with concurrent.futures.ThreadPoolExecutor(len(items)) as pool:
            results = list(pool.map(run, items))
        compared = 0
        for (name, g), res in zip(items, results):
            self.assertEqual(res.code, grpc.StatusCode.OK, (name, res.details))
            compared += gc.count_greedy_matches(self, name, res, g)
        print(f"greedy tokens compared with llama.cpp before its first near tie: {compared}")
        self.assertGreaterEqual(compared, 30, "too few greedy tokens compared")
        outputs = {name: [g["tokens"] for g in out["greedy"]] for name, out in golden["outputs"].items()}
        self.assertNotEqual(outputs["all-r8"], outputs["base"])
        self.assertNotEqual(outputs["attn-r4"], outputs["base"])

        # Prefix cache: the base model's cached pages of a prompt are not an adapter's.
        text = ("In the early years of the last century the railway reached the small mountain "
                "village, and life changed for the farmers who lived there.")  # not sent before
        def cached(model_name):
            status, body = post(r.http_port, "/v1/completions", {
                "model": model_name, "prompt": text, "max_tokens": 1, "temperature": 0})
            self.assertEqual(status, 200, body)
            return body["usage"]["prompt_tokens_details"]["cached_tokens"]
        cached(base_name)
        self.assertGreater(cached(base_name), 0)
        self.assertEqual(cached("all-r8"), 0)
        self.assertGreater(cached("all-r8"), 0)
        self.assertEqual(cached("attn-r4"), 0)
        # Requests per adapter on the worker's /metrics: 3 prompt-logprob texts, 2 greedy
        # prompts and the cache checks (all-r8: 2, attn-r4: 1).
        # (A request is counted when Submit returns, which a short one may outlive.)
        lora_requests = lambda a: cl.metric(w.metrics(), "tinyserve_lora_requests_total", adapter=a)
        self.assertTrue(cl.wait_for(lambda: lora_requests("all-r8") == 7, 5), lora_requests("all-r8"))
        self.assertTrue(cl.wait_for(lambda: lora_requests("attn-r4") == 6, 5),
                        lora_requests("attn-r4"))

    def test_bad_adapters(self):
        paths = self.make_adapters(self.cluster.model, ["attn-r4"])
        good = f"tiny={paths['attn-r4']}"
        for args, needle in [
                (["--lora", "x=/nonexistent/a.gguf"], "no such file /nonexistent/a.gguf"),
                (["--lora", f"x={self.cluster.model}"], "not a LoRA adapter: it has no general.type"),
                (["--lora", good, "--lora", good], "'tiny' is given twice"),
                (["--lora", "x"], "expected NAME=PATH")]:
            w = self.cluster.worker(*args, ready=False)
            self.assertNotEqual(w.wait(timeout=60), 0, args)
            with open(os.path.join(self.cluster.log_dir, f"worker-{w.port}.log")) as f:
                self.assertIn(needle, f.read(), args)

        w = self.cluster.worker("--lora", good)
        r = self.cluster.router([w])
        req = ct.request("Once upon a time", max_tokens=4)
        req.lora_adapter = "nope"
        res = ct.generate(r.address, req)
        self.assertEqual(res.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("lora_adapter: no adapter named 'nope' (loaded: tiny)", res.details)
        req.lora_adapter = "tiny"
        self.assertEqual(ct.generate(r.address, req).code, grpc.StatusCode.OK)
        status, body = post(r.http_port, "/v1/completions",
                            {"model": "nope", "prompt": "Once", "max_tokens": 2})
        self.assertEqual(status, 404, body)
        self.assertEqual(body["error"]["param"], "model")
        self.assertIn("does not exist", body["error"]["message"])
        status, body = post(r.http_port, "/v1/chat/completions", {
            "model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["model"], "tiny")
        # Without adapters, any "model" is the base model (as before).
        plain = self.cluster.worker()
        r2 = self.cluster.router([plain])
        status, body = post(r2.http_port, "/v1/completions",
                            {"model": "anything", "prompt": "Once", "max_tokens": 2})
        self.assertEqual(status, 200, body)
        # An adapter may not take the served model's name (requests naming it get the base).
        base_name = get(r2.http_port, "/v1/models")["data"][0]["id"]
        w = self.cluster.worker("--lora", f"{base_name}={paths['attn-r4']}", ready=False)
        self.assertNotEqual(w.wait(timeout=60), 0)
        with open(os.path.join(self.cluster.log_dir, f"worker-{w.port}.log")) as f:
            self.assertIn("is the served model's name", f.read())
        # --served-model-name renames the base model everywhere: /v1/models, GetModelInfo,
        # "model" (its old name is now unknown), and the adapter-name check.
        w = self.cluster.worker("--served-model-name", "smol", "--lora", good)
        r3 = self.cluster.router([w])
        self.assertEqual([m["id"] for m in get(r3.http_port, "/v1/models")["data"]],
                         ["smol", "tiny"])
        status, body = post(r3.http_port, "/v1/completions",
                            {"model": "smol", "prompt": "Once", "max_tokens": 2})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["model"], "smol")
        status, body = post(r3.http_port, "/v1/completions",
                            {"model": base_name, "prompt": "Once", "max_tokens": 2})
        self.assertEqual(status, 404, body)
        build = [l for l in w.metrics().splitlines() if l.startswith("tinyserve_build_info{")]
        self.assertEqual(len(build), 1)
        self.assertIn('model="smol"', build[0])
        w = self.cluster.worker("--served-model-name", "tiny", "--lora", good, ready=False)
        self.assertNotEqual(w.wait(timeout=60), 0)
        with open(os.path.join(self.cluster.log_dir, f"worker-{w.port}.log")) as f:
            self.assertIn("is the served model's name", f.read())

    def test_runtime_load_and_unload(self):
        S = ct.S
        paths = self.make_adapters(self.cluster.model, ["all-r8"])
        static = self.cluster.worker("--lora", f"tiny={paths['all-r8']}")
        w1 = self.cluster.worker("--allow-runtime-lora")
        w2 = self.cluster.worker("--allow-runtime-lora")
        r = self.cluster.router([w1, w2])

        def greedy(address, adapter, max_tokens=24):
            req = ct.request("Once upon a time", max_tokens=max_tokens, ignore_eos=True)
            req.lora_adapter = adapter
            res = ct.generate(address, req, timeout=60)
            self.assertEqual(res.code, grpc.StatusCode.OK, res.details)
            return res.ids
        want, base = greedy(static.address, "tiny"), greedy(static.address, "")
        self.assertNotEqual(want, base)

        def admin(route, body):
            return load_or_unload(r.http_port, route, body)

        load = {"lora_name": "tiny", "lora_path": paths["all-r8"]}
        self.assertEqual(admin("load_lora_adapter", load),
                         "Success: LoRA adapter 'tiny' added successfully.")
        models = get(r.http_port, "/v1/models")["data"]
        self.assertEqual([m["id"] for m in models][1:], ["tiny"])
        self.assertEqual(models[1]["root"], paths["all-r8"])
        for w in (w1, w2):  # loaded on every worker: the same tokens as loaded at start
            self.assertEqual(greedy(w.address, "tiny"), want)
            self.assertEqual(greedy(w.address, ""), base)
        status, body = post(r.http_port, "/v1/completions",
                            {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 4})
        self.assertEqual(status, 200, body)
        # One greedy request per worker and the completion: counted per adapter.
        self.assertTrue(cl.wait_for(lambda: sum(cl.metric(
            w.metrics(), "tinyserve_lora_requests_total", adapter="tiny") or 0 for w in (w1, w2))
            == 3, 5))
        # Refusals, each naming the problem: a name in use, a missing file, an adapter for
        # another model shape, a bad name, a worker that does not allow it.
        for body, code, needle in [
                (load, 409, "already loaded"),
                ({"lora_name": "x", "lora_path": "/nonexistent/a.gguf"}, 404, "no such file"),
                ({"lora_name": "x", "lora_path": self.cluster.model}, 400, "not a LoRA adapter"),
                ({"lora_name": "-x", "lora_path": paths["all-r8"]}, 400, "lora_name"),
                ({"lora_name": "x"}, 400, "lora_path")]:
            status, out = post(r.http_port, "/v1/load_lora_adapter", body)
            self.assertEqual(status, code, f"{body}: {out}")
            self.assertIn(needle, out["error"]["message"], body)
        with cl.channel(static.address) as ch:
            with self.assertRaises(grpc.RpcError) as e:
                S.grpc.TinyServeStub(ch).LoadLoraAdapter(
                    S.pb.LoadLoraAdapterRequest(lora_name="y", lora_path=paths["all-r8"]),
                    timeout=30)
            self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn("--allow-runtime-lora", e.exception.details())

        self.assertIn("removed", admin("unload_lora_adapter", {"lora_name": "tiny"}))
        self.assertEqual([m["id"] for m in get(r.http_port, "/v1/models")["data"]][1:], [])
        # Its counter series goes with it (names loaded and unloaded do not pile up).
        for w in (w1, w2):
            self.assertNotIn('adapter="tiny"', w.metrics())
        req = ct.request("Once upon a time", max_tokens=4)
        req.lora_adapter = "tiny"
        res = ct.generate(r.address, req)
        self.assertEqual(res.code, grpc.StatusCode.INVALID_ARGUMENT, res.details)
        status, body = post(r.http_port, "/v1/unload_lora_adapter", {"lora_name": "tiny"})
        self.assertEqual(status, 404, body)
        # Loaded again (a new id: cached pages of the old one are not reused), the same tokens.
        admin("load_lora_adapter", load)
        self.assertEqual(greedy(w2.address, "tiny"), want)
        self.assertEqual(w1.server_info().kv_pages_used, 0)

        # Unload while a request with the adapter runs (SmolLM2: 300 tokens take a second or
        # more here): it finishes with the adapter.
        model = cl.smollm2_model(self)
        big = self.make_adapters(model, ["attn-r4"])["attn-r4"]
        w3 = self.cluster.worker("--model", model, "--allow-runtime-lora")
        with cl.channel(w3.address) as ch:
            S.grpc.TinyServeStub(ch).LoadLoraAdapter(
                S.pb.LoadLoraAdapterRequest(lora_name="a", lora_path=big), timeout=60)
        want = greedy(w3.address, "a", max_tokens=300)
        long_req = ct.request("Once upon a time", max_tokens=300, ignore_eos=True)
        long_req.lora_adapter = "a"
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            running = pool.submit(ct.generate, w3.address, long_req, 120)
            self.assertTrue(cl.wait_for(
                lambda: (w3.server_info() or S.pb.ServerInfo()).running > 0, 10))
            with cl.channel(w3.address) as ch:
                S.grpc.TinyServeStub(ch).UnloadLoraAdapter(
                    S.pb.UnloadLoraAdapterRequest(lora_name="a"), timeout=30)
            self.assertGreater((w3.server_info() or S.pb.ServerInfo()).running, 0,
                               "the request ended before the unload: nothing was checked")
            res = running.result()
        self.assertEqual(res.code, grpc.StatusCode.OK, res.details)
        self.assertEqual(res.ids, want)

    def test_adapters_follow_workers(self):
        paths = self.make_adapters(self.cluster.model, ["all-r8"])
        with_it = self.cluster.worker("--lora", f"tiny={paths['all-r8']}")
        without = self.cluster.worker()
        r = self.cluster.router([with_it, without])

        def greedy(address, adapter):
            req = ct.request("Once upon a time", max_tokens=12, ignore_eos=True)
            req.lora_adapter = adapter
            return ct.generate(address, req, timeout=60)
        want = greedy(with_it.address, "tiny").ids
        # Without routing by adapter, about half of these would reach `without` and be refused.
        for _ in range(8):
            res = greedy(r.address, "tiny")
            self.assertEqual(res.code, grpc.StatusCode.OK, res.details)
            self.assertEqual(res.ids, want)
        self.assertFalse(cl.metric(without.metrics(), "tinyserve_requests_total",
                                   outcome="invalid"))
        for _ in range(4):  # whichever worker answers first, the router lists both models
            self.assertEqual([m["id"] for m in get(r.http_port, "/v1/models")["data"]][1:],
                             ["tiny"])
        status, body = post(r.http_port, "/v1/completions",
                            {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 4})
        self.assertEqual(status, 200, body)

        # Run-time adapters: loaded through the router, copied onto a worker that restarted,
        # unloaded from one that missed the unload.
        w1 = self.cluster.worker("--allow-runtime-lora")
        w2 = self.cluster.worker("--allow-runtime-lora")
        r = self.cluster.router([w1, w2])
        load_or_unload(r.http_port, "load_lora_adapter",
                       {"lora_name": "tiny", "lora_path": paths["all-r8"]})

        def adapters(w):
            with cl.channel(w.address) as ch:
                info = ct.S.grpc.TinyServeStub(ch).GetModelInfo(ct.S.pb.GetModelInfoRequest(),
                                                                timeout=5)
            return [a.name for a in info.lora_adapters]
        self.assertEqual(adapters(w2), ["tiny"])
        w2.start()  # SIGKILL and start again: its run-time adapters are gone
        w2.wait_ready()
        for _ in range(6):  # until the router copies it, requests naming it go to w1
            res = greedy(r.address, "tiny")
            self.assertEqual(res.code, grpc.StatusCode.OK, res.details)
            self.assertEqual(res.ids, want)
        self.assertTrue(cl.wait_for(lambda: adapters(w2) == ["tiny"], 15), self.cluster.logs())
        self.assertEqual(greedy(w2.address, "tiny").ids, want)
        # (The router counts the sync when the worker's answer reaches it, just after the
        # worker has the adapter.)
        self.assertTrue(cl.wait_for(lambda: (cl.metric(
            r.metrics(), "tinyserve_router_lora_syncs_total", op="load", result="ok") or 0) >= 1,
            5))

        def healthy(w):
            return cl.metric(r.metrics(), "tinyserve_router_worker_healthy", worker=w.address)
        w2.kill(signal.SIGSTOP)  # unreachable, not restarted: it keeps the adapter
        try:
            self.assertTrue(cl.wait_for(lambda: healthy(w2) == 0, 15))
            load_or_unload(r.http_port, "unload_lora_adapter", {"lora_name": "tiny"})
            self.assertEqual(adapters(w1), [])
        finally:
            w2.kill(signal.SIGCONT)
        self.assertTrue(cl.wait_for(lambda: healthy(w2) == 1, 15))
        self.assertTrue(cl.wait_for(lambda: adapters(w2) == [], 15), self.cluster.logs())
        self.assertEqual(adapters(w1), [])  # not copied back from w2 meanwhile
        self.assertTrue(cl.wait_for(lambda: (cl.metric(
            r.metrics(), "tinyserve_router_lora_syncs_total", op="unload", result="ok") or 0) >= 1,
            5))

        # Two router replicas: a load through one and an unload through the other settle (the
        # workers hold the state; neither replica loads it back).
        r2 = self.cluster.router([w1, w2])
        load_or_unload(r.http_port, "load_lora_adapter",
                       {"lora_name": "tiny", "lora_path": paths["all-r8"]})
        self.assertEqual((adapters(w1), adapters(w2)), (["tiny"], ["tiny"]))
        load_or_unload(r2.http_port, "unload_lora_adapter", {"lora_name": "tiny"})

        def syncs():
            return sum(cl.metric(x.metrics(), "tinyserve_router_lora_syncs_total") for x in (r, r2))
        # A router may see one worker's report before the other's and send one harmless sync
        # within a poll round (0.2 s): settled once the count holds for a second.
        def settled():
            was = syncs()
            time.sleep(1)
            return syncs() == was
        self.assertTrue(cl.wait_for(settled, 15))
        before = syncs()
        time.sleep(2)
        self.assertEqual((adapters(w1), adapters(w2)), ([], []))
        self.assertEqual(syncs(), before)
        # A copy's load time may not be in the future (it would outrank every later unload).
        with cl.channel(w1.address) as ch:
            with self.assertRaises(grpc.RpcError) as e:
                ct.S.grpc.TinyServeStub(ch).LoadLoraAdapter(
                    ct.S.pb.LoadLoraAdapterRequest(lora_name="tiny", lora_path=paths["all-r8"],
                                                   loaded_at=time.time() + 3600), timeout=30)
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("loaded_at", e.exception.details())


if __name__ == "__main__":
    ct.S = cl.stubs()
    sys.exit(cl.run_tests())
