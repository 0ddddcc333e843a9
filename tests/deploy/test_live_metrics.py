#!/usr/bin/env python3
"""Live metric checks against a real `tinyserve worker` and `tinyserve router`.

--mode names:      every metric name used by the Grafana dashboards and the Prometheus rules exists
                   in the /metrics scrapes of the running router and worker.
--mode prometheus: a real Prometheus (Debian's /usr/bin/prometheus) scrapes both every second with
                   deploy/prometheus/rules.yml loaded; `up` is 1 for both targets, the sparse page
                   hit-rate histogram reaches Prometheus, and every rule evaluates without error.

Both modes send one generation through the router (quest policy, small budget, oracle sampling on)
so that labelled series exist; the worker loads a LoRA adapter (scripts/make_lora_adapter.py) so
that its per-adapter series exists too. Exit 77 (CTest skip) only when the tinyserve binary is missing.
Ports are picked free; every wait is bounded; the processes are ended at exit.
"""
import argparse
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

SKIP = 77
PROCS = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd, log):
    print("+", " ".join(map(str, cmd)), flush=True)
    p = subprocess.Popen([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
    PROCS.append((p, cmd[0]))
    return p


def stop_all():
    for p, _ in reversed(PROCS):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.time() + 15
    for p, _ in reversed(PROCS):
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


def http_get(url, timeout=3):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def wait_for(what, fn, timeout, procs=()):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        for p, name in procs:
            if p.poll() is not None:
                raise SystemExit(f"FAIL: {name} exited with {p.returncode} while waiting for {what}")
        try:
            v = fn()
            if v:
                return v
        except Exception as e:  # not up yet
            last = e
        time.sleep(0.5)
    raise SystemExit(f"FAIL: timed out after {timeout}s waiting for {what} (last error: {last})")


def metric_families(text):
    """Names in a Prometheus text scrape: families from # TYPE lines and sample names."""
    types, samples = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(None, 3)
            types[name] = typ.strip()
        elif line and not line.startswith("#"):
            samples.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0))
    return types, samples


def exposed(name, types, samples):
    if name in samples or name in types:
        return True
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            if types.get(base) in ("histogram", "summary") and (suffix != "_bucket" or types[base] == "histogram"):
                return True
    return False




def names_in_expr(expr):
    """tinyserve_* metric names referenced by a PromQL expression (label values and strings ignored)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)       # drop string literals (label values)
    expr = re.sub(r"\{[^}]*\}", "{}", expr)                # drop matchers
    expr = re.sub(r"\bby\s*\([^)]*\)|\bwithout\s*\([^)]*\)|\bon\s*\([^)]*\)|\bignoring\s*\([^)]*\)", "", expr)
    return set(re.findall(r"\btinyserve_[a-zA-Z0-9_]+\b", expr))


def used_names(repo):
    import yaml
    exprs = []
    for f in sorted((repo / "deploy/grafana/dashboards").glob("*.json")):
        def walk(o):
            if isinstance(o, dict):
                for k, v in o.items():
                    if k in ("expr", "query", "definition") and isinstance(v, str):
                        exprs.append((f.name, v))
                    else:
                        walk(v)
            elif isinstance(o, list):
                for v in o:
                    walk(v)
        walk(json.loads(f.read_text()))
    rules = yaml.safe_load((repo / "deploy/prometheus/rules.yml").read_text())
    recorded = set()
    for g in rules["groups"]:
        for r in g["rules"]:
            exprs.append(("rules.yml", r["expr"]))
            if "record" in r:
                recorded.add(r["record"])
    out = {}
    for where, e in exprs:
        for n in names_in_expr(e):
            if n not in recorded:
                out.setdefault(n, set()).add(where)
    return out


def compile_stubs(repo, work):
    from grpc_tools import protoc
    out = work / "stubs"
    out.mkdir(parents=True, exist_ok=True)
    proto_dir = repo / "proto"
    args = ["protoc", f"-I{proto_dir}", f"--python_out={out}", f"--grpc_python_out={out}",
            str(proto_dir / "tinyserve/v1/tinyserve.proto")]
    import grpc_tools
    args.insert(1, f"-I{pathlib.Path(grpc_tools.__file__).parent / '_proto'}")
    if protoc.main(args) != 0:
        raise SystemExit("FAIL: protoc could not compile proto/tinyserve/v1/tinyserve.proto")
    sys.path.insert(0, str(out))
    from tinyserve.v1 import tinyserve_pb2, tinyserve_pb2_grpc
    return tinyserve_pb2, tinyserve_pb2_grpc


def generate_once(repo, work, port):
    import grpc
    pb, pb_grpc = compile_stubs(repo, work)
    prompt = ("Once upon a time there was a little girl named Lily. She liked to play in the park "
              "with her friend Tom. One day they found a big red ball under a tree. ") * 3
    req = pb.GenerateRequest(
        request_id="deploy-test-1", text=prompt,
        sampling=pb.SamplingOptions(max_tokens=24, temperature=0.0),
        selection=pb.SelectionOptions(policy="quest", budget=32, oracle_every=1))
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = pb_grpc.TinyServeStub(ch)
        deadline = time.time() + 60
        while True:
            try:
                got = list(stub.Generate(req, timeout=60))
                break
            except grpc.RpcError as e:
                # The router may not have seen the worker healthy yet.
                if e.code() == grpc.StatusCode.UNAVAILABLE and time.time() < deadline:
                    time.sleep(1)
                    continue
                raise SystemExit(f"FAIL: Generate through the router: {e.code()} {e.details()}")
    kinds = [m.WhichOneof("response") for m in got]
    if "complete" not in kinds:
        raise SystemExit(f"FAIL: Generate ended without a Complete message: {kinds}")
    print(f"generation: {kinds.count('chunk')} chunks, then complete", flush=True)


def prom_query(base, q):
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    data = json.loads(http_get(url))
    if data.get("status") != "success":
        raise RuntimeError(data)
    return data["data"]["result"]

def default_model():
    """stories260K from the test data: $TINYSERVE_DATA, else shared/data beside the checkout."""
    data = os.environ.get("TINYSERVE_DATA") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "data")
    return os.path.join(data, "models", "stories260K", "stories260K.gguf")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["names", "prometheus"], required=True)
    ap.add_argument("--repo", required=True, type=pathlib.Path)
    ap.add_argument("--binary", required=True, type=pathlib.Path)
    ap.add_argument("--model", default=default_model(), type=pathlib.Path)
    ap.add_argument("--prometheus", default="/usr/bin/prometheus")
    ap.add_argument("--work", required=True, type=pathlib.Path)
    a = ap.parse_args()
    repo = a.repo.resolve()
    if not a.binary.exists():
        print(f"SKIP: {a.binary} does not exist (build the `tinyserve` target first); "
              "this test runs as soon as it does.")
        return SKIP
    if not a.model.exists():
        raise SystemExit(f"FAIL: model {a.model} not found (set TINYSERVE_DATA, or run scripts/test)")
    a.work.mkdir(parents=True, exist_ok=True)
    wport, wmport, rport, rmport = free_port(), free_port(), free_port(), free_port()
    rhport = free_port()
    wlog = open(a.work / "worker.log", "w")
    rlog = open(a.work / "router.log", "w")
    try:
        # With a LoRA adapter (scripts/make_lora_adapter.py) so that its per-adapter series exists.
        sys.path.insert(0, str(repo / "scripts"))
        import make_lora_adapter
        adapter = a.work / "live-lora.gguf"
        make_lora_adapter.write(str(a.model), str(adapter), "attn-r4")
        worker = start([a.binary, "worker", "--model", a.model, "--port", wport, "--metrics-port", wmport,
                        "--lora", f"live={adapter}"], wlog)
        wait_for("worker /metrics", lambda: "tinyserve_" in http_get(f"http://127.0.0.1:{wmport}/metrics"),
                 90, [(worker, "worker")])
        router = start([a.binary, "router", "--port", rport, "--metrics-port", rmport,
                        "--http-port", rhport, "--workers", f"localhost:{wport}"], rlog)
        wait_for("router /metrics", lambda: "tinyserve_" in http_get(f"http://127.0.0.1:{rmport}/metrics"),
                 60, [(worker, "worker"), (router, "router")])
        generate_once(repo, a.work, rport)
        # One request through the OpenAI-compatible HTTP API too, so its counter is scraped.
        http_get(f"http://127.0.0.1:{rhport}/v1/models")
        time.sleep(1.5)  # one more metrics update after the stream ends

        if a.mode == "names":
            wt, ws = metric_families(http_get(f"http://127.0.0.1:{wmport}/metrics"))
            rt, rs = metric_families(http_get(f"http://127.0.0.1:{rmport}/metrics"))
            types, samples = {**wt, **rt}, ws | rs
            used = used_names(repo)
            missing = {n: w for n, w in used.items() if not exposed(n, types, samples)}
            print(f"{len(used)} metric names used by dashboards and rules; "
                  f"{len(types)} families scraped from worker and router")
            for n, where in sorted(missing.items()):
                print(f"FAIL: {n} (used in {', '.join(sorted(where))}) is not in the /metrics scrapes")
            if missing:
                return 1
            print("names: all used metric names are exposed")
            return 0

        # --mode prometheus
        pport = free_port()
        cfg = a.work / "prometheus.yml"
        cfg.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: ['{repo / 'deploy/prometheus/rules.yml'}']\n"
            "scrape_configs:\n"
            f"  - job_name: tinyserve-worker\n    static_configs: [{{targets: ['127.0.0.1:{wmport}']}}]\n"
            f"  - job_name: tinyserve-router\n    static_configs: [{{targets: ['127.0.0.1:{rmport}']}}]\n")
        shutil.rmtree(a.work / "tsdb", ignore_errors=True)
        plog = open(a.work / "prometheus.log", "w")
        prom = start([a.prometheus, f"--config.file={cfg}", f"--storage.tsdb.path={a.work / 'tsdb'}",
                      f"--web.listen-address=127.0.0.1:{pport}"], plog)
        base = f"http://127.0.0.1:{pport}"
        procs = [(worker, "worker"), (router, "router"), (prom, "prometheus")]
        wait_for("Prometheus ready", lambda: "Ready" in http_get(f"{base}/-/ready"), 60, procs)
        ups = wait_for("up == 1 for both targets",
                       lambda: (lambda r: r if len(r) == 2 else None)(prom_query(base, "up == 1")), 30, procs)
        print("up:", sorted(x["metric"]["job"] for x in ups))
        hit = wait_for("tinyserve_selection_page_hit_rate_count in Prometheus",
                       lambda: prom_query(base, "sum by (policy) (tinyserve_selection_page_hit_rate_count) > 0"),
                       30, procs)
        print("page hit rate samples:", [(x["metric"].get("policy"), x["value"][1]) for x in hit])
        gen = wait_for("tinyserve_generation_tokens_total in Prometheus",
                       lambda: prom_query(base, "tinyserve_generation_tokens_total > 0"), 30, procs)
        print("generated tokens:", gen[0]["value"][1])
        time.sleep(3)  # a few rule evaluations
        groups = json.loads(http_get(f"{base}/api/v1/rules"))["data"]["groups"]
        bad = [(r["name"], r.get("lastError")) for g in groups for r in g["rules"]
               if r.get("health") not in ("ok", "unknown")]
        nrules = sum(len(g["rules"]) for g in groups)
        if nrules == 0 or bad:
            print(f"FAIL: rules loaded={nrules}, unhealthy={bad}")
            return 1
        print(f"prometheus: {nrules} rules evaluate cleanly; all checks passed")
        return 0
    finally:
        stop_all()


if __name__ == "__main__":
    sys.exit(main())
