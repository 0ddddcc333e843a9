"""OpenTelemetry tracing on a real cluster: a worker and a router on loopback export spans over
OTLP/HTTP JSON to a receiver run by this test, which checks every batch against OpenTelemetry's
own protos (opentelemetry-proto's ExportTraceServiceRequest) and the W3C trace context rules.

  python tracing_test.py --binary build/bin/tinyserve [--model PATH] [-k NAME]
"""
import base64
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import grpc
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_lib as cl  # noqa: E402

S = None  # generated stubs
HEX32, HEX16 = re.compile(r"^[0-9a-f]{32}$"), re.compile(r"^[0-9a-f]{16}$")


class Receiver:
    """An OTLP/HTTP receiver on a free port: validates each POST to /v1/traces and keeps its
    spans (as dicts, with the resource's service.name added as "service")."""

    def __init__(self):
        self.spans, self.errors, self.lock = [], [], threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                try:
                    receiver.accept(self.path, self.headers.get("Content-Type"), body)
                    self.send_response(200)
                except Exception as e:  # recorded; the test fails on it
                    with receiver.lock:
                        receiver.errors.append(repr(e))
                    self.send_response(400)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def accept(self, path, content_type, body):
        assert path == "/v1/traces", path
        assert content_type == "application/json", content_type
        doc = json.loads(body)
        # OTLP/JSON writes ids in hex where proto3 JSON would use base64 (the OTLP spec): check
        # them, then let protobuf's strict parser check everything else against the protos.
        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for sp in ss["spans"]:
                    for key, pattern in (("traceId", HEX32), ("spanId", HEX16),
                                         ("parentSpanId", HEX16)):
                        if key in sp:
                            assert pattern.match(sp[key]), (key, sp[key])
                            sp[key] = base64.b64encode(bytes.fromhex(sp[key])).decode()
        msg = json_format.Parse(json.dumps(doc), trace_service_pb2.ExportTraceServiceRequest())
        spans = []
        for rs in msg.resource_spans:
            service = {a.key: a.value.string_value for a in rs.resource.attributes}["service.name"]
            for ss in rs.scope_spans:
                assert ss.scope.name == "tinyserve"
                for sp in ss.spans:
                    assert 0 < sp.start_time_unix_nano <= sp.end_time_unix_nano
                    attrs = {}
                    for a in sp.attributes:
                        attrs[a.key] = getattr(a.value, a.value.WhichOneof("value"))
                    spans.append({"service": service, "name": sp.name, "kind": sp.kind,
                                  "trace": sp.trace_id.hex(), "span": sp.span_id.hex(),
                                  "parent": sp.parent_span_id.hex(), "attrs": attrs,
                                  "status": sp.status.code, "start": sp.start_time_unix_nano,
                                  "end": sp.end_time_unix_nano})
        with self.lock:
            self.spans.extend(spans)

    def of_trace(self, trace, n, timeout=15):
        def got():
            with self.lock:
                found = [s for s in self.spans if s["trace"] == trace]
            return found if len(found) >= n else None
        return cl.wait_for(got, timeout, interval=0.1) or []

    def close(self):
        self.server.shutdown()


def generate(address, metadata=(), max_tokens=8):
    req = S.pb.GenerateRequest(text="Once upon a time")
    req.sampling.max_tokens = max_tokens
    complete = None
    with cl.channel(address) as ch:
        for msg in S.grpc.TinyServeStub(ch).Generate(req, metadata=list(metadata), timeout=30):
            if msg.HasField("complete"):
                complete = msg.complete
    return complete


class TracingTest(cl.ClusterCase):
    def setUp(self):
        super().setUp()
        self.rx = Receiver()

    def tearDown(self):
        self.rx.close()
        super().tearDown()

    def test_spans_follow_the_callers_trace_through_router_and_worker(self):
        flags = ["--otlp-traces-endpoint", self.rx.url]
        w = self.cluster.worker(*flags)
        r = self.cluster.router([w], *flags)
        trace, client_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        complete = generate(r.address, [("traceparent", f"00-{trace}-{client_span}-01")])
        self.assertEqual(complete.usage.completion_tokens, 8)
        spans = self.rx.of_trace(trace, 3)
        self.assertEqual(self.rx.errors, [])
        by_name = {s["name"]: s for s in spans}
        self.assertEqual(sorted(by_name), ["tinyserve.router.attempt", "tinyserve.router.generate",
                                           "tinyserve.worker.generate"], spans)
        router, attempt = by_name["tinyserve.router.generate"], by_name["tinyserve.router.attempt"]
        worker = by_name["tinyserve.worker.generate"]
        self.assertEqual((router["service"], attempt["service"], worker["service"]),
                         ("tinyserve-router", "tinyserve-router", "tinyserve-worker"))
        # client -> router (SERVER) -> its attempt on a worker (CLIENT) -> the worker (SERVER).
        self.assertEqual(router["parent"], client_span)
        self.assertEqual(attempt["parent"], router["span"])
        self.assertEqual(worker["parent"], attempt["span"])
        self.assertEqual((router["kind"], attempt["kind"], worker["kind"]), (2, 3, 2))
        self.assertLessEqual(router["start"], attempt["start"])
        self.assertLessEqual(attempt["start"], worker["start"])
        self.assertLessEqual(worker["end"], attempt["end"])
        self.assertLessEqual(attempt["end"], router["end"])
        self.assertEqual(attempt["attrs"]["tinyserve.worker"], w.address)
        a = worker["attrs"]
        self.assertEqual(a["gen_ai.usage.output_tokens"], complete.usage.completion_tokens)
        self.assertEqual(a["gen_ai.usage.input_tokens"], complete.usage.prompt_tokens)
        self.assertEqual(a["gen_ai.request.max_tokens"], 8)
        self.assertEqual(a["gen_ai.response.finish_reasons"], "length")
        self.assertAlmostEqual(a["gen_ai.latency.e2e"], complete.timing.e2e_seconds, places=6)
        self.assertEqual(a["tinyserve.selection.policy"], "dense")
        self.assertEqual(router["attrs"]["tinyserve.worker"], w.address)
        self.assertEqual(router["attrs"]["tinyserve.attempts"], 1)
        self.assertEqual(router["status"], 0)  # UNSET: no error

        # No traceparent: the router starts the trace, which the worker continues.
        before = len(self.rx.spans)
        generate(r.address)
        self.assertTrue(cl.wait_for(lambda: len(self.rx.spans) >= before + 3, 15))
        new = {s["name"]: s for s in self.rx.spans[before:before + 3]}
        router, worker = new["tinyserve.router.generate"], new["tinyserve.worker.generate"]
        self.assertEqual(router["parent"], "")
        self.assertEqual((worker["trace"], worker["parent"]),
                         (router["trace"], new["tinyserve.router.attempt"]["span"]))

        # Through the HTTP API: the traceparent header is followed the same way.
        http_trace, http_span = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
        req = urllib.request.Request(
            f"http://127.0.0.1:{r.http_port}/v1/completions",
            data=b'{"prompt": "Once upon a time", "max_tokens": 4}',
            headers={"Content-Type": "application/json",
                     "traceparent": f"00-{http_trace}-{http_span}-01"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            self.assertEqual(resp.status, 200)
        spans = self.rx.of_trace(http_trace, 3)
        router = [s for s in spans if s["name"] == "tinyserve.router.generate"][0]
        self.assertEqual(router["parent"], http_span)

        # Not sampled upstream (flags 00): nothing is recorded for that trace.
        quiet = "11111111111111111111111111111111"
        generate(r.address, [("traceparent", f"00-{quiet}-2222222222222222-00")])
        generate(r.address, [("traceparent", "00-not-a-valid-header-01")])  # ignored
        time.sleep(2.5)  # two export periods
        self.assertEqual(self.rx.of_trace(quiet, 1, timeout=0.1), [])
        # A refused call is a span with an error status.
        errors_before = len(self.rx.spans)
        bad = S.pb.GenerateRequest(text="hi")
        bad.sampling.temperature = -1
        with cl.channel(w.address) as ch, self.assertRaises(grpc.RpcError):
            list(S.grpc.TinyServeStub(ch).Generate(bad, timeout=10))
        self.assertTrue(cl.wait_for(
            lambda: any(s["status"] == 2 and s["service"] == "tinyserve-worker"
                        for s in self.rx.spans[errors_before:]), 15))
        self.assertEqual(self.rx.errors, [])
        # Both count what they exported.
        for proc in (w, r):
            self.assertTrue(cl.wait_for(lambda: (cl.metric(
                proc.metrics(), "tinyserve_trace_spans_total", result="exported") or 0) >= 3, 10))

    def test_serving_goes_on_when_the_collector_is_away(self):
        # Spans to a closed port are dropped (logged once a minute); requests are unaffected.
        closed = f"http://127.0.0.1:{cl.free_port()}/v1/traces"
        w = self.cluster.worker("--otlp-traces-endpoint", closed)
        for _ in range(3):
            self.assertEqual(generate(w.address).usage.completion_tokens, 8)
        self.assertTrue(cl.wait_for(lambda: (cl.metric(
            w.metrics(), "tinyserve_trace_spans_total", result="dropped") or 0) >= 3, 10))
        self.assertTrue(w.alive())
        # A URL it cannot post to is refused at start, naming the flag.
        p = subprocess.run([self.binary, "router", "--workers", w.address, "--port",
                            str(cl.free_port()), "--metrics-port", "0", "--http-port", "0",
                            "--otlp-traces-endpoint", "https://collector:4318"],
                           capture_output=True, text=True, timeout=30)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--otlp-traces-endpoint", p.stderr)

    def test_a_black_holed_collector_does_not_hold_up_shutdown(self):
        # A listener whose accept queue is full drops new SYNs, as a firewalled collector does:
        # a connect to it hangs. The worker's span post gives up in seconds, and SIGTERM still
        # ends the worker promptly.
        hole = socket.socket()
        hole.bind(("127.0.0.1", 0))
        hole.listen(0)
        port = hole.getsockname()[1]
        fill = [socket.socket() for _ in range(8)]
        for s in fill:
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
        try:
            w = self.cluster.worker("--otlp-traces-endpoint", f"http://127.0.0.1:{port}/v1/traces")
            self.assertEqual(generate(w.address).usage.completion_tokens, 8)
            time.sleep(1.5)  # the exporter is now stuck connecting
            start = time.monotonic()
            w.kill(signal.SIGTERM)
            self.assertEqual(w.wait(20), 0)
            self.assertLess(time.monotonic() - start, 6)
        finally:
            for s in fill + [hole]:
                s.close()


if __name__ == "__main__":
    S = cl.stubs()
    sys.exit(cl.run_tests())
