"""TLS, mutual TLS and API keys on a real cluster: a worker and a router on loopback serving
stories260K, certificates made by the openssl CLI in a temp dir for each test.

  python security_test.py --binary build/bin/tinyserve [--model PATH] [-k NAME]

What the worker and router must do (worker/server/rpc_security.h):
  - serve gRPC over TLS; refuse plaintext clients and clients that do not trust the server;
  - with --tls-client-ca, refuse clients without a certificate that CA signed (the router has
    one: --worker-tls-cert);
  - with --api-key, answer UNAUTHENTICATED to calls without "authorization: Bearer KEY", on
    gRPC as on HTTP, while grpc.health.v1 stays open;
  - serve grpc.health.v1 in plaintext on --health-port, for probes that cannot speak TLS;
  - pick up a renewed certificate without a restart (--tls-reload);
  - serve the OpenAI HTTP API over HTTPS with --http-tls-cert/--http-tls-key (the official
    client, plain and streamed), refusing plaintext and untrusting clients, renewals included;
  - refuse to start on bad TLS files with an error naming the flag.
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_lib as cl  # noqa: E402

S = None  # generated stubs
KEY = "test-key-0123"
AUTH = [("authorization", f"Bearer {KEY}")]


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


class Pki:
    """A CA and the certificates it signs (EC P-256), as PEM files in `dir`."""

    def __init__(self, dir, name):
        self.dir, self.name = dir, name
        self.ca = self.path("ca.pem")
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                "-nodes", "-keyout", self.path("ca.key"), "-out", self.ca, "-days", "2",
                "-subj", f"/CN={name}-ca", cwd=dir)

    def path(self, leaf):
        return os.path.join(self.dir, f"{self.name}-{leaf}")

    def issue(self, cn, san="DNS:localhost,IP:127.0.0.1"):
        """(cert, key) for `cn`, valid for the names in `san`."""
        key, csr, cert, ext = (self.path(f"{cn}.{x}") for x in ("key", "csr", "pem", "ext"))
        with open(ext, "w") as f:
            f.write(f"subjectAltName={san}\n")
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", key, "-out", csr, "-subj", f"/CN={cn}", cwd=self.dir)
        openssl("x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self.path("ca.key"),
                "-CAcreateserial", "-out", cert, "-days", "2", "-extfile", ext, cwd=self.dir)
        return cert, key


def read(path):
    with open(path, "rb") as f:
        return f.read()


def tls_channel(address, ca, cert=None, key=None):
    creds = grpc.ssl_channel_credentials(
        root_certificates=read(ca), private_key=read(key) if key else None,
        certificate_chain=read(cert) if cert else None)
    return grpc.secure_channel(address, creds)


def health(ch, service="readiness", timeout=5):
    """grpc.health.v1.Health/Check, hand-encoded; True when SERVING."""
    check = ch.unary_unary("/grpc.health.v1.Health/Check")
    reply = check(b"\x0a" + bytes([len(service)]) + service.encode(), timeout=timeout)
    return reply[:2] == b"\x08\x01"


def generate(ch, text="Once upon a time", max_tokens=8, metadata=AUTH, timeout=30):
    """(text, complete) of one streamed Generate; raises grpc.RpcError."""
    req = S.pb.GenerateRequest(text=text)
    req.sampling.max_tokens = max_tokens
    out, complete = "", None
    for msg in S.grpc.TinyServeStub(ch).Generate(req, metadata=metadata, timeout=timeout):
        if msg.HasField("chunk"):
            out += msg.chunk.text
        elif msg.HasField("complete"):
            complete = msg.complete
    return out, complete


def code_of(fn):
    try:
        fn()
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def wait_healthy(port, timeout=60):
    """Waits for readiness on a plaintext health port."""
    def ready():
        try:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                return health(ch, timeout=1)
        except grpc.RpcError:
            return False
    if not cl.wait_for(ready, timeout, interval=0.2):
        raise TimeoutError(f"health port {port} not SERVING readiness after {timeout} s")


class SecurityTest(cl.ClusterCase):
    def setUp(self):
        super().setUp()
        self.dir = tempfile.mkdtemp(prefix="tinyserve-tls-")
        self.pki = Pki(self.dir, "cluster")
        self.server_cert, self.server_key = self.pki.issue("server")
        self.client_cert, self.client_key = self.pki.issue("router", san="DNS:router")

    def tearDown(self):
        super().tearDown()
        shutil.rmtree(self.dir, ignore_errors=True)

    def renew_server_certificate(self):
        """Replaces the server's files with a certificate from a new CA (returned), renamed into
        place as a Kubernetes Secret volume update does (no half-written file)."""
        renewed = Pki(self.dir, "renewed")
        cert, key = renewed.issue("server")
        for src, dst in ((key, self.server_key), (cert, self.server_cert)):
            shutil.copy(src, dst + ".new")
            os.replace(dst + ".new", dst)
        return renewed

    def secure_worker(self, *extra):
        hport = cl.free_port()
        w = self.cluster.worker("--tls-cert", self.server_cert, "--tls-key", self.server_key,
                                "--tls-client-ca", self.pki.ca, "--api-key", KEY,
                                "--health-port", str(hport), *extra, ready=False)
        w.health_port = hport
        wait_healthy(hport)
        return w

    def test_tls_mutual_tls_and_api_key(self):
        w = self.secure_worker()
        hport = cl.free_port()
        r = self.cluster.router(
            [w], "--tls-cert", self.server_cert, "--tls-key", self.server_key,
            "--worker-tls-ca", self.pki.ca, "--worker-tls-cert", self.client_cert,
            "--worker-tls-key", self.client_key, "--api-key", KEY, "--health-port", str(hport),
            ready=False)
        wait_healthy(hport)  # the router is ready only once it reached the worker over mTLS

        # Through the router, over TLS, with the key: the same text as straight from the worker
        # (greedy), so the proxy adds nothing.
        with tls_channel(r.address, self.pki.ca) as ch:
            text, complete = generate(ch)
            self.assertTrue(text)
            self.assertEqual(complete.finish_reason, S.pb.FINISH_REASON_LENGTH)
            self.assertEqual(complete.usage.completion_tokens, 8)
            # The API key: missing or wrong -> UNAUTHENTICATED, for every method.
            stub = S.grpc.TinyServeStub(ch)
            for metadata in ([], [("authorization", "Bearer wrong")],
                             [("authorization", KEY)]):
                self.assertEqual(code_of(lambda: generate(ch, metadata=metadata)),
                                 grpc.StatusCode.UNAUTHENTICATED, metadata)
                for call, req in ((stub.Tokenize, S.pb.TokenizeRequest(text="hi")),
                                  (stub.GetModelInfo, S.pb.GetModelInfoRequest()),
                                  (stub.GetServerInfo, S.pb.GetServerInfoRequest()),
                                  (stub.Abort, S.pb.AbortRequest(request_ids=["x"]))):
                    self.assertEqual(
                        code_of(lambda: call(req, metadata=metadata, timeout=5)),
                        grpc.StatusCode.UNAUTHENTICATED, (call, metadata))
            self.assertEqual(len(stub.Tokenize(S.pb.TokenizeRequest(text="hi"), metadata=AUTH,
                                               timeout=5).token_ids) > 0, True)
            info = stub.GetServerInfo(S.pb.GetServerInfoRequest(), metadata=AUTH, timeout=5)
            self.assertTrue(info.ready)
            # grpc.health.v1 needs no key (probes), on the TLS port too.
            self.assertTrue(health(ch))
        # Refused keys are the client's fault: outcome "invalid", not "error" (alerts).
        self.assertEqual(cl.metric(r.metrics(), "tinyserve_router_requests_total",
                                   outcome="invalid"), 3)
        self.assertFalse(cl.metric(r.metrics(), "tinyserve_router_requests_total",
                                   outcome="error"))
        with tls_channel(w.address, self.pki.ca, self.client_cert, self.client_key) as ch:
            direct, _ = generate(ch)
            self.assertEqual(direct, text)

        # Plaintext to a TLS port, or a client that does not trust the server: no connection.
        with cl.channel(r.address) as ch:
            self.assertEqual(code_of(lambda: generate(ch, timeout=5)),
                             grpc.StatusCode.UNAVAILABLE)
        other = Pki(self.dir, "other")
        with tls_channel(r.address, other.ca) as ch:
            self.assertEqual(code_of(lambda: generate(ch, timeout=5)),
                             grpc.StatusCode.UNAVAILABLE)
        # Mutual TLS: the worker refuses a client without a certificate, or with one signed by
        # another CA.
        with tls_channel(w.address, self.pki.ca) as ch:
            self.assertEqual(code_of(lambda: generate(ch, timeout=5)),
                             grpc.StatusCode.UNAVAILABLE)
        stranger_cert, stranger_key = other.issue("stranger")
        with tls_channel(w.address, self.pki.ca, stranger_cert, stranger_key) as ch:
            self.assertEqual(code_of(lambda: generate(ch, timeout=5)),
                             grpc.StatusCode.UNAVAILABLE)

        # The HTTP API checks the same key (and passes it on to the gRPC service in-process).
        def http(auth):
            req = urllib.request.Request(
                f"http://127.0.0.1:{r.http_port}/v1/completions",
                data=b'{"prompt": "Once upon a time", "max_tokens": 4}',
                headers={"Content-Type": "application/json", **auth})
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    return resp.status
            except urllib.error.HTTPError as e:
                return e.code
        self.assertEqual(http({"Authorization": f"Bearer {KEY}"}), 200)
        self.assertEqual(http({}), 401)

        # No KV page is left behind by the refused and finished calls.
        with tls_channel(w.address, self.pki.ca, self.client_cert, self.client_key) as ch:
            control = S.wgrpc.WorkerControlStub(ch)
            self.assertEqual(code_of(lambda: control.GetLoad(S.wpb.GetLoadRequest(), timeout=5)),
                             grpc.StatusCode.UNAUTHENTICATED)
            used = cl.wait_for(lambda: control.GetLoad(S.wpb.GetLoadRequest(), metadata=AUTH,
                                                       timeout=5).kv_pages_used == 0, 10)
            self.assertTrue(used, "KV pages still in use")

    def test_renewed_certificate_is_served_without_restart(self):
        # The worker's files are replaced by a certificate from a new CA; with --tls-reload 1
        # new connections get it within seconds, and clients of the old CA are refused.
        w = self.secure_worker("--tls-reload", "1")
        with tls_channel(w.address, self.pki.ca, self.client_cert, self.client_key) as ch:
            self.assertTrue(generate(ch)[0])
        renewed = self.renew_server_certificate()

        def renewed_served():
            with tls_channel(w.address, renewed.ca, self.client_cert, self.client_key) as ch:
                return code_of(lambda: generate(ch, timeout=5)) == grpc.StatusCode.OK
        self.assertTrue(cl.wait_for(renewed_served, 20, interval=0.5),
                        "the renewed certificate was not served")
        with tls_channel(w.address, self.pki.ca, self.client_cert, self.client_key) as ch:
            self.assertEqual(code_of(lambda: generate(ch, timeout=5)),
                             grpc.StatusCode.UNAVAILABLE)

    def test_https_api(self):
        import ssl
        import openai
        w = self.cluster.worker()
        r = self.cluster.router([w], "--http-tls-cert", self.server_cert, "--http-tls-key",
                                self.server_key, "--tls-reload", "1", "--http-threads", "2")
        base = f"https://127.0.0.1:{r.http_port}"
        api = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0,
                            http_client=openai.DefaultHttpxClient(
                                verify=ssl.create_default_context(cafile=self.pki.ca)))
        out = api.completions.create(model="m", prompt="Once upon a time", max_tokens=8,
                                     temperature=0)
        self.assertEqual(out.usage.completion_tokens, 8)
        streamed = "".join(c.choices[0].text for c in api.completions.create(
            model="m", prompt="Once upon a time", max_tokens=8, temperature=0, stream=True)
            if c.choices)
        self.assertEqual(streamed, out.choices[0].text)
        chat = api.chat.completions.create(model="m", max_tokens=4,
                                           messages=[{"role": "user", "content": "Hi"}])
        self.assertEqual(chat.usage.completion_tokens, 4)
        # Clients that connect and stall their handshake (slowloris), more of them than the
        # connections --http-threads 2 relays, do not keep working clients out.
        stalled = [socket.create_connection(("127.0.0.1", r.http_port)) for _ in range(12)]
        for sock in stalled:
            sock.sendall(b"\x16")  # the first byte of a ClientHello, then nothing
        fresh = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0,
                              http_client=openai.DefaultHttpxClient(
                                  verify=ssl.create_default_context(cafile=self.pki.ca)))
        ok = fresh.completions.create(model="m", prompt="Once", max_tokens=2, temperature=0)
        self.assertEqual(ok.usage.completion_tokens, 2)  # a new connection, not a kept-alive one
        for sock in stalled:
            sock.close()
        # Refused: a client that does not trust the CA, and plaintext HTTP on that port.
        with self.assertRaises(openai.APIConnectionError):
            openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0).models.list()
        with self.assertRaises(Exception):
            urllib.request.urlopen(f"http://127.0.0.1:{r.http_port}/health", timeout=5)
        # A renewed certificate (from a new CA) is served to new connections within seconds.
        renewed = self.renew_server_certificate()

        def renewed_served():
            try:
                with urllib.request.urlopen(base + "/health", timeout=5,
                                            context=ssl.create_default_context(cafile=renewed.ca)):
                    return True
            except (OSError, urllib.error.URLError):
                return False
        self.assertTrue(cl.wait_for(renewed_served, 20, interval=0.5),
                        "the renewed certificate was not served")
        self.assertTrue(r.alive())

    def test_bad_tls_files_are_named(self):
        not_pem = os.path.join(self.dir, "not.pem")
        with open(not_pem, "w") as f:
            f.write("hello\n")
        _, other_key = self.pki.issue("other")
        missing = os.path.join(self.dir, "missing.pem")
        cert, key, ca = self.server_cert, self.server_key, self.pki.ca
        cases = [
            (["worker", "--tls-cert", cert], "--tls-cert: needs --tls-key"),
            (["worker", "--tls-cert", cert, "--tls-key", other_key],
             "--tls-key: the key in"),
            (["worker", "--tls-cert", not_pem, "--tls-key", key], "holds no PEM certificate"),
            (["worker", "--tls-cert", cert, "--tls-key", not_pem], "holds no PEM private key"),
            (["worker", "--tls-cert", missing, "--tls-key", key],
             "--tls-cert: cannot read"),
            (["worker", "--tls-client-ca", ca], "--tls-client-ca: needs --tls-cert"),
            (["worker", "--tls-cert", cert, "--tls-key", key, "--tls-client-ca", not_pem],
             "--tls-client-ca:"),
            (["router", "--workers", "127.0.0.1:1", "--worker-tls-ca", not_pem],
             "--worker-tls-ca:"),
            (["router", "--workers", "127.0.0.1:1", "--worker-tls-cert", cert],
             "--worker-tls-ca:"),
            (["router", "--workers", "127.0.0.1:1", "--worker-tls-ca", ca, "--worker-tls-cert",
              cert, "--worker-tls-key", other_key], "--worker-tls-key: the key in"),
            (["router", "--workers", "127.0.0.1:1", "--http-tls-cert", cert],
             "--http-tls-cert: needs --http-tls-key"),
            (["router", "--workers", "127.0.0.1:1", "--http-tls-cert", missing, "--http-tls-key",
              key], "--http-tls-cert: cannot read"),
            (["router", "--workers", "127.0.0.1:1", "--http-tls-cert", cert, "--http-tls-key",
              other_key], "--http-tls-key: the key in"),
        ]
        for args, expected in cases:
            http = str(cl.free_port()) if "--http-tls-cert" in args else "0"
            common = ["--port", str(cl.free_port()), "--metrics-port", "0", "--http-port", http]
            if args[0] == "worker":
                common += ["--model", self.model]
            p = subprocess.run([self.binary, *args, *common], capture_output=True, text=True,
                               timeout=30)
            self.assertNotEqual(p.returncode, 0, args)
            self.assertIn(expected, p.stderr, args)
            self.assertNotIn("Traceback", p.stderr)
        # The client names its flags too.
        p = subprocess.run([self.binary, "generate", "--server", "127.0.0.1:1", "--prompt", "x",
                            "--tls-ca", not_pem], capture_output=True, text=True, timeout=30)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--tls-ca:", p.stderr)


if __name__ == "__main__":
    S = cl.stubs()
    sys.exit(cl.run_tests())
