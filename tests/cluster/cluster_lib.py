"""Helpers for TinyServe's process-level tests: Python stubs generated from the protos at test
time, free ports, worker and router processes that are always killed, metric scrapes.

Used by the tests here and by bench/load_bench.py and bench/http_bench.py (which also share
run_concurrently and percentile).
"""
import concurrent.futures
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROTO_DIR = os.path.join(ROOT, "proto")

_stubs = None


def stubs():
    """Generates tinyserve/v1/*_pb2{,_grpc}.py into a temp dir (once) and imports them."""
    global _stubs
    if _stubs is not None:
        return _stubs
    from grpc_tools import protoc
    import grpc_tools
    out = tempfile.mkdtemp(prefix="tinyserve-stubs-")
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    for name in ("tinyserve", "worker"):
        rc = protoc.main(["protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={out}",
                          f"--grpc_python_out={out}",
                          os.path.join(PROTO_DIR, "tinyserve", "v1", f"{name}.proto")])
        if rc != 0:
            raise RuntimeError(f"protoc failed on {name}.proto")
    sys.path.insert(0, out)
    from tinyserve.v1 import tinyserve_pb2, tinyserve_pb2_grpc, worker_pb2, worker_pb2_grpc

    class Stubs:
        pb = tinyserve_pb2
        grpc = tinyserve_pb2_grpc
        wpb = worker_pb2
        wgrpc = worker_pb2_grpc
    _stubs = Stubs
    return _stubs


_handed_out = set()  # ports free_port() returned in this process


def free_port():
    """A free loopback port, never one returned before in this process: the kernel may hand the
    same ephemeral port out twice in a row once it is closed (a router's gRPC and metrics ports
    then collided)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def channel(address, max_message=64 << 20):
    import grpc
    return grpc.insecure_channel(address, options=[
        ("grpc.max_receive_message_length", max_message),
        ("grpc.max_send_message_length", max_message),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ])


class Proc:
    """A child process (worker or router) with its ports; killed when the test ends."""

    def __init__(self, binary, role, args, port, metrics_port, log_dir):
        self.role, self.port, self.metrics_port = role, port, metrics_port
        self.address = f"127.0.0.1:{port}"
        self.binary, self.args, self.log_dir = binary, args, log_dir
        # With --api-key every call but grpc.health needs the key.
        key = args[args.index("--api-key") + 1] if "--api-key" in args else None
        self.metadata = [("authorization", f"Bearer {key}")] if key else []
        self.popen = None
        self.start()

    def start(self):
        if self.popen is not None:
            self.kill(signal.SIGKILL)
            self.popen.wait(timeout=10)
        with open(os.path.join(self.log_dir, f"{self.role}-{self.port}.log"), "ab") as log:
            self.popen = subprocess.Popen([self.binary, self.role] + self.args, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self):
        return self.popen is not None and self.popen.poll() is None

    def kill(self, sig=signal.SIGKILL):
        if self.alive():
            self.popen.send_signal(sig)

    def wait(self, timeout):
        return self.popen.wait(timeout=timeout)

    def stop(self):
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)

    def server_info(self, timeout=1.0):
        s = stubs()
        with channel(self.address) as ch:
            return s.grpc.TinyServeStub(ch).GetServerInfo(s.pb.GetServerInfoRequest(),
                                                          metadata=self.metadata,
                                                          timeout=timeout)

    def wait_ready(self, timeout=60.0):
        import grpc
        deadline = time.time() + timeout
        while time.time() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.role} on {self.address} exited with "
                                   f"{self.popen.returncode}; see {self.log_dir}")
            try:
                if self.server_info().ready:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{self.role} on {self.address} not ready after {timeout} s")

    def metrics(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=5) as r:
            return r.read().decode()


class Cluster(contextlib.AbstractContextManager):
    """Starts workers and routers on free loopback ports; stops them all on exit."""

    def __init__(self, binary, model):
        self.binary, self.model = binary, model
        self.procs = []
        self.log_dir = tempfile.mkdtemp(prefix="tinyserve-cluster-")

    def worker(self, *extra, port=None, ready=True):
        port = port or free_port()
        p = Proc(self.binary, "worker",
                 ["--model", self.model, "--host", "127.0.0.1", "--port", str(port),
                  "--metrics-port", str(free_port()), "--drain-timeout", "5"] + list(extra),
                 port, None, self.log_dir)
        p.metrics_port = int(p.args[p.args.index("--metrics-port") + 1])
        self.procs.append(p)
        if ready:
            p.wait_ready()
        return p

    def router(self, workers, *extra, ready=True):
        port, mport, hport = free_port(), free_port(), free_port()
        p = Proc(self.binary, "router",
                 ["--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(mport),
                  "--http-port", str(hport), "--workers", ",".join(w.address for w in workers),
                  "--health-interval", "0.2", "--drain-timeout", "5"] + list(extra),
                 port, mport, self.log_dir)
        p.http_port = hport
        self.procs.append(p)
        if ready:
            p.wait_ready()
        return p

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill(signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.wait(timeout=10)
        return False

    def logs(self):
        out = []
        for name in sorted(os.listdir(self.log_dir)):
            with open(os.path.join(self.log_dir, name), errors="replace") as f:
                out.append(f"--- {name}\n" + f.read()[-4000:])
        return "\n".join(out)


class ClusterCase(unittest.TestCase):
    """A test case with a fresh Cluster per test (self.cluster), whose logs are printed when the
    test fails. run_tests() sets `binary` and `model` from the command line."""
    binary = None
    model = None

    def setUp(self):
        self.cluster = Cluster(self.binary, self.model)
        self.cluster.__enter__()

    def tearDown(self):
        failed = not getattr(self._outcome, "success", True)
        self.cluster.__exit__(None, None, None)
        if failed:
            sys.stderr.write(self.cluster.logs())


def run_tests():
    """Parses --binary and --model (the rest goes to unittest, e.g. -k NAME), runs the tests of
    __main__ and returns the exit code."""
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--model", default=default_model())
    args, rest = parser.parse_known_args()
    if not os.path.exists(args.model):
        print(f"FAIL: model {args.model} not found (set TINYSERVE_DATA, or run scripts/test, "
              "which fetches the test data)")
        return 1
    ClusterCase.binary, ClusterCase.model = args.binary, args.model
    prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


def run_concurrently(items, concurrency, fn):
    """fn(item) for every item, `concurrency` at a time; (results in item order, wall seconds)."""
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(fn, items))
    return results, time.perf_counter() - start


def percentile(values, p):
    """The p-th percentile (0..100) with linear interpolation; None for no values."""
    if not values:
        return None
    values = sorted(values)
    k = (len(values) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def print_report(report, output=None):
    """Prints a benchmark's JSON report, and writes it to `output` too when given."""
    text = json.dumps(report, indent=2)
    print(text)
    if output:
        with open(output, "w") as f:
            f.write(text + "\n")


def metric(text, name, **labels):
    """Sum of the samples of `name` whose labels include `labels`."""
    total, found = 0.0, False
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
            found = True
    return total if found else None


def wait_for(predicate, timeout, interval=0.1):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


def smollm2_model(case):
    """SmolLM2-135M-Instruct Q4_1, the default model scripts/fetch-model downloads; fails `case`
    when it is missing."""
    model = os.path.join(os.environ.get("TINYSERVE_CACHE") or
                         os.path.expanduser("~/.cache/tinyserve"),
                         "SmolLM2-135M-Instruct.Q4_1.gguf")
    case.assertTrue(os.path.exists(model), f"{model} missing (scripts/fetch-model)")
    return model


def default_model():
    """stories260K from the test data: $TINYSERVE_DATA, else shared/data beside the checkout."""
    data = os.environ.get("TINYSERVE_DATA") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "data")
    return os.path.join(data, "models", "stories260K", "stories260K.gguf")

