#!/usr/bin/env python3
"""Renders helm/tinyserve with tools/helm-render (no helm binary needed) and checks the result.

For the default values and every helm/tinyserve/ci/*-values.yaml file:
  - the merged values validate against values.schema.json (as `helm install` would);
  - every manifest validates against the Kubernetes OpenAPI schemas (kubernetes-validate, strict)
    for a few Kubernetes versions; Prometheus Operator objects get a structural check;
  - the objects say what the chart promises (probes, GPUs, TP flags, drain, dashboards ...).
Also: the chart refuses bad values, the dashboard/rules copies are current, compose.yaml parses.
Exit 0 on success, 1 with messages on failure.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys

import jsonschema
import kubernetes_validate
import yaml

KUBE_VERSIONS = ["1.28.0", "1.30.0", "1.33.0"]
FAILURES = []


def fail(msg):
    FAILURES.append(msg)
    print("FAIL:", msg)


def check(cond, msg):
    if not cond:
        fail(msg)
    return cond


def build_renderer(repo, work):
    work.mkdir(parents=True, exist_ok=True)
    gopath = work / "gopath"
    gopath.mkdir(exist_ok=True)
    out = work / "helm-render"
    env = dict(os.environ, GO111MODULE="off", GOPATH=f"{gopath}:/usr/share/gocode",
               GOCACHE=str(work / "gocache"), GOFLAGS="")
    try:
        subprocess.run(["go", "build", "-o", str(out), str(repo / "tools/helm-render/main.go")],
                       check=True, env=env, timeout=240)
    except FileNotFoundError:
        sys.exit("FAIL: `go` not found: install golang-go golang-github-masterminds-sprig-dev "
                 "golang-k8s-sigs-yaml-dev (scripts/deps/apt.txt)")
    return out


def render(renderer, chart, values_files, extra=(), kube="1.30.0", show_values=False):
    cmd = [str(renderer), "--name", "ts", "--namespace", "llm", "--kube-version", kube]
    for f in values_files:
        cmd += ["-f", str(f)]
    cmd += list(extra)
    if show_values:
        cmd.append("--show-values")
    cmd.append(str(chart))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def crd_check(doc, where):
    kind = doc.get("kind")
    spec = doc.get("spec") or {}
    check(doc.get("metadata", {}).get("name"), f"{where}: metadata.name missing")
    if kind == "ServiceMonitor":
        check(isinstance(spec.get("selector", {}).get("matchLabels"), dict), f"{where}: selector.matchLabels")
        eps = spec.get("endpoints")
        if check(isinstance(eps, list) and eps, f"{where}: endpoints"):
            for ep in eps:
                check(set(ep) <= {"port", "path", "interval", "scrapeTimeout", "relabelings",
                                  "metricRelabelings", "scheme", "honorLabels"}, f"{where}: endpoint keys {set(ep)}")
                check(ep.get("port") == "metrics", f"{where}: endpoint port must be the named port 'metrics'")
    elif kind == "PrometheusRule":
        groups = spec.get("groups")
        if check(isinstance(groups, list) and groups, f"{where}: spec.groups"):
            for g in groups:
                check(g.get("name") and isinstance(g.get("rules"), list), f"{where}: group {g.get('name')}")
                for r in g["rules"]:
                    check(("alert" in r) != ("record" in r) and "expr" in r, f"{where}: rule {r}")
    else:
        fail(f"{where}: unexpected custom kind {kind}")


def containers(doc):
    spec = doc["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec.get("containers", []) + spec.get("initContainers", [])}


def semantic_checks(name, docs, values):
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    w, r = values["worker"], values["router"]
    sts = by_kind.get("StatefulSet", [])
    dep = by_kind.get("Deployment", [])
    if not (check(len(sts) == 1, f"{name}: one worker StatefulSet") and
            check(len(dep) == 1, f"{name}: one router Deployment")):
        return
    sts, dep = sts[0], dep[0]
    headless = [s for s in by_kind.get("Service", []) if s["spec"].get("clusterIP") == "None"]
    check(len(headless) == 1 and headless[0]["metadata"]["name"] == sts["spec"]["serviceName"],
          f"{name}: StatefulSet.serviceName names the headless Service")
    wc = containers(sts)["worker"]
    rc = containers(dep)["router"]
    cm = [c for c in by_kind["ConfigMap"] if c["metadata"]["name"].endswith("-config")][0]["data"]

    # Router finds workers through the headless service's DNS name.
    want_dns = f"{headless[0]['metadata']['name']}.llm.svc.cluster.local:{w['grpcPort']}"
    check(cm["TINYSERVE_WORKERS_DNS"] == want_dns, f"{name}: workers DNS {cm['TINYSERVE_WORKERS_DNS']}")
    check("--workers-dns=$(TINYSERVE_WORKERS_DNS)" in rc["args"], f"{name}: router --workers-dns")
    check(cm["TINYSERVE_POLICY"] == w["policy"] and cm["TINYSERVE_BUDGET"] == str(w["budget"]),
          f"{name}: policy/budget in ConfigMap")
    for flag in ("--policy=$(TINYSERVE_POLICY)", "--budget=$(TINYSERVE_BUDGET)", "--model=$(TINYSERVE_MODEL)",
                 f"--port={w['grpcPort']}", f"--metrics-port={w['metricsPort']}"):
        check(flag in wc["args"], f"{name}: worker arg {flag}")
    check(wc["args"][0] == "worker" and rc["args"][0] == "router", f"{name}: subcommands")
    served = values["model"].get("servedName", "")
    named = [a for a in wc["args"] if a.startswith("--served-model-name")]
    check(named == ([f"--served-model-name={served}"] if served else []),
          f"{name}: worker --served-model-name from model.servedName ({named})")
    # The OpenAI-compatible HTTP API: flag, container port and Service port agree.
    hp = r.get("httpPort", 0)
    check(f"--http-port={hp}" in rc["args"], f"{name}: router --http-port={hp}")
    rsvc = [s for s in by_kind.get("Service", []) if s["metadata"]["name"] == dep["metadata"]["name"]]
    svc_http = [p for s in rsvc for p in s["spec"]["ports"] if p["name"] == "http"]
    ctr_http = [p for p in rc.get("ports", []) if p["name"] == "http"]
    if hp:
        check(len(svc_http) == 1 and svc_http[0]["port"] == hp and len(ctr_http) == 1 and
              ctr_http[0]["containerPort"] == hp, f"{name}: router http port {hp} on pod and Service")
    else:
        check(not svc_http and not ctr_http, f"{name}: no http port when httpPort is 0")
    secret = r.get("apiKeySecret", {}).get("name", "")
    env = {e["name"]: e for e in rc.get("env", [])}
    if secret:
        ref = env.get("TINYSERVE_API_KEY", {}).get("valueFrom", {}).get("secretKeyRef", {})
        check(ref.get("name") == secret and ref.get("key") == r["apiKeySecret"]["key"],
              f"{name}: TINYSERVE_API_KEY from Secret {secret}")
    else:
        check("TINYSERVE_API_KEY" not in env, f"{name}: no API key without a Secret")

    # Native gRPC probes with the health service names: on the gRPC port, or with TLS on the
    # plaintext health port (kubelet's gRPC probes cannot speak TLS).
    tls = values["tls"]
    for c, vals in ((wc, w), (rc, r)):
        port = tls["healthPort"] if tls["secretName"] else vals["grpcPort"]
        for probe, svc in (("livenessProbe", "livenessService"), ("readinessProbe", "readinessService"),
                           ("startupProbe", "livenessService")):
            g = c.get(probe, {}).get("grpc", {})
            check(g.get("port") == port and g.get("service", "") == vals["probes"][svc],
                  f"{name}: {c['name']} {probe} grpc {g}")

    # TLS: both serve with the Secret's pair; workers require client certificates from its CA;
    # the router presents the pair to workers and expects the worker Service's name.
    tls_args = {a for c in (wc, rc) for a in c["args"] if "tls" in a or a.startswith("--health-port")}
    if tls["secretName"]:
        d = "/etc/tinyserve/tls"
        server = [f"--tls-cert={d}/tls.crt", f"--tls-key={d}/tls.key",
                  f"--tls-reload={tls['reloadSeconds']}", f"--health-port={tls['healthPort']}"]
        server_name = tls.get("workerServerName") or \
            f"{headless[0]['metadata']['name']}.llm.svc.cluster.local"
        for flag in server + [f"--tls-client-ca={d}/ca.crt"]:
            check(flag in wc["args"], f"{name}: worker arg {flag}")
        for flag in server + [f"--worker-tls-ca={d}/ca.crt", f"--worker-tls-cert={d}/tls.crt",
                              f"--worker-tls-key={d}/tls.key",
                              f"--worker-tls-server-name={server_name}"]:
            check(flag in rc["args"], f"{name}: router arg {flag}")
        https = [f"--http-tls-cert={d}/tls.crt", f"--http-tls-key={d}/tls.key"]
        for flag in https:  # HTTPS on the router's HTTP API only with tls.http
            check((flag in rc["args"]) == bool(tls.get("http")), f"{name}: router arg {flag}")
            check(flag not in wc["args"], f"{name}: worker arg {flag}")
        for doc, c in ((sts, wc), (dep, rc)):
            vols = doc["spec"]["template"]["spec"].get("volumes", [])
            check(any(v["name"] == "tls" and v.get("secret", {}).get("secretName") == tls["secretName"]
                      for v in vols), f"{name}: {c['name']} TLS Secret volume")
            check(any(m["name"] == "tls" and m["mountPath"] == d and m.get("readOnly")
                      for m in c.get("volumeMounts", [])), f"{name}: {c['name']} TLS mount")
            check(any(p["name"] == "health" and p["containerPort"] == tls["healthPort"]
                      for p in c["ports"]), f"{name}: {c['name']} health port")
    else:
        check(not tls_args, f"{name}: no TLS flags without tls.secretName: {tls_args}")

    # Autoscaling: an HPA on the StatefulSet, which then leaves its replicas to it.
    auto = w["autoscaling"]
    hpas = by_kind.get("HorizontalPodAutoscaler", [])
    if auto["enabled"]:
        if check(len(hpas) == 1, f"{name}: one worker HPA"):
            spec = hpas[0]["spec"]
            ref = spec["scaleTargetRef"]
            check(ref["kind"] == "StatefulSet" and ref["name"] == sts["metadata"]["name"],
                  f"{name}: HPA targets the worker StatefulSet: {ref}")
            check((spec["minReplicas"], spec["maxReplicas"]) ==
                  (auto["minReplicas"], auto["maxReplicas"]), f"{name}: HPA bounds")
            m = spec["metrics"][0]
            check(m["type"] == "Pods" and m["pods"]["metric"]["name"] == auto["metric"] and
                  m["pods"]["target"]["averageValue"] == str(auto["targetAverageValue"]),
                  f"{name}: HPA metric {m}")
        check("replicas" not in sts["spec"], f"{name}: no replicas on an autoscaled StatefulSet")
    else:
        check(not hpas, f"{name}: no HPA unless worker.autoscaling.enabled")
        check(sts["spec"].get("replicas") == w["replicas"], f"{name}: worker replicas")

    # Tracing: both processes get the endpoint and ratio, or neither has a tracing flag.
    tr = values["tracing"]
    for c in (wc, rc):
        got = [a for a in c["args"] if a.startswith(("--otlp", "--trace"))]
        want = ([f"--otlp-traces-endpoint={tr['otlpEndpoint']}",
                 f"--trace-sample-ratio={tr['sampleRatio']}"] if tr["otlpEndpoint"] else [])
        check(got == want, f"{name}: {c['name']} tracing args {got} != {want}")

    # Drain: grace >= preStop sleep + drain timeout.
    pod = sts["spec"]["template"]["spec"]
    pre = wc["lifecycle"]["preStop"]
    sleep_s = pre["sleep"]["seconds"] if "sleep" in pre else int(pre["exec"]["command"][-1])
    check(sleep_s == w["preStopSleepSeconds"], f"{name}: preStop sleep")
    check(pod["terminationGracePeriodSeconds"] >= sleep_s + w["drainTimeoutSeconds"], f"{name}: grace period")

    # GPUs and tensor parallelism.
    tp = w["tensorParallelSize"]
    limits = wc.get("resources", {}).get("limits", {})
    if w["gpu"]["enabled"]:
        check(limits.get(w["gpu"]["resourceName"]) == tp * w["gpu"]["perRank"], f"{name}: GPU limit {limits}")
        check(wc["image"].endswith("-cuda\"") or wc["image"].endswith("-cuda"), f"{name}: CUDA image {wc['image']}")
    else:
        check("nvidia.com/gpu" not in limits, f"{name}: no GPU without gpu.enabled")
    on_gpu = w["gpu"]["enabled"] and tp == 1
    check(("--device=cuda" in wc["args"]) == on_gpu, f"{name}: --device=cuda iff one GPU rank")
    pages = int(w["gpu"].get("kvDevicePages", 0))
    check(any(a == f"--kv-device-pages={pages}" for a in wc["args"]) == (on_gpu and pages > 0),
          f"{name}: --kv-device-pages")
    if tp > 1:
        check("--tp-size=$(TINYSERVE_TP_SIZE)" in wc["args"] and "--tp-launch=local" in wc["args"],
              f"{name}: TP flags")
        check(cm["TINYSERVE_TP_SIZE"] == str(tp), f"{name}: TP size in ConfigMap")
        check(any(v["name"] == "dshm" for v in pod["volumes"]), f"{name}: /dev/shm for NCCL")
    else:
        check(not any(a.startswith("--tp-") for a in wc["args"]), f"{name}: no TP flags at TP=1")
    env = {e["name"]: e.get("value") for e in wc.get("env", [])}
    check(env.get("TINYSERVE_TP_RANK") == "0", f"{name}: rank 0 env")

    # Model: fetch init container when source=fetch.
    inits = {c["name"] for c in pod.get("initContainers", [])}
    check(("fetch-model" in inits) == (values["model"]["source"] == "fetch"), f"{name}: fetch-model init")

    # PDBs, dashboards, ServiceMonitor.
    pdbs = by_kind.get("PodDisruptionBudget", [])
    check(any(p["metadata"]["name"] == sts["metadata"]["name"] for p in pdbs), f"{name}: worker PDB")
    dash = [c for c in by_kind["ConfigMap"] if c["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    if check(dash, f"{name}: dashboard ConfigMap with grafana_dashboard=1"):
        for c in dash:
            for key, text in c["data"].items():
                try:
                    check(json.loads(text).get("panels"), f"{name}: dashboard {key} has panels")
                except ValueError as e:
                    fail(f"{name}: dashboard {key} is not JSON: {e}")
    if values["metrics"]["serviceMonitor"]["enabled"]:
        sm = by_kind.get("ServiceMonitor", [])
        if check(len(sm) == 1, f"{name}: ServiceMonitor"):
            sel = sm[0]["spec"]["selector"]["matchLabels"]
            svcs = [s for s in by_kind["Service"]
                    if all(s["metadata"]["labels"].get(k) == v for k, v in sel.items())]
            check(len(svcs) == 2 and all(any(p["name"] == "metrics" for p in s["spec"]["ports"]) for s in svcs),
                  f"{name}: ServiceMonitor selects router and worker services with a metrics port")


def check_case(renderer, repo, chart, schema, name, files):
    print(f"== {name}: {[str(f.relative_to(repo)) for f in files] or 'default values'}")
    res = render(renderer, chart, files, show_values=True)
    if not check(res.returncode == 0, f"{name}: --show-values: {res.stderr}"):
        return
    values = json.loads(res.stdout)
    for err in jsonschema.Draft7Validator(schema).iter_errors(values):
        fail(f"{name}: values.schema.json: {'/'.join(map(str, err.path))}: {err.message}")
    for kube in KUBE_VERSIONS:
        res = render(renderer, chart, files, kube=kube, extra=["--notes"])
        if not check(res.returncode == 0, f"{name}@{kube}: render failed: {res.stderr}"):
            continue
        docs = [d for d in yaml.safe_load_all(res.stdout) if d]
        check(len(docs) >= 8, f"{name}@{kube}: only {len(docs)} manifests")
        for d in docs:
            where = f"{name}@{kube}: {d.get('kind')}/{d.get('metadata', {}).get('name')}"
            if d.get("apiVersion", "").startswith("monitoring.coreos.com/"):
                crd_check(d, where)
                continue
            try:
                kubernetes_validate.validate(d, kube, strict=True)
            except kubernetes_validate.ValidationError as e:
                fail(f"{where}: {e.message} at {'/'.join(map(str, e.path))}")
            except Exception as e:  # SchemaNotFoundError and the like
                fail(f"{where}: {type(e).__name__}: {e}")
        pre = [d for d in docs if d["kind"] == "StatefulSet"][0]["spec"]["template"]["spec"]["containers"][0][
            "lifecycle"]["preStop"]
        check(("sleep" in pre) == (kube >= "1.30.0"), f"{name}@{kube}: preStop form {pre}")
        semantic_checks(f"{name}@{kube}", docs, values)
    print(f"   rendered and validated for Kubernetes {', '.join(KUBE_VERSIONS)}")


def negative_cases(renderer, chart, schema, work):
    bad = work / "bad-values.yaml"
    # Schema: TP size 0 and an unknown policy are refused.
    bad.write_text("worker:\n  tensorParallelSize: 0\n  policy: magic\n"
                   "tracing:\n  otlpEndpoint: grpc://collector:4317\n")
    values = json.loads(render(renderer, chart, [bad], show_values=True).stdout)
    errs = list(jsonschema.Draft7Validator(schema).iter_errors(values))
    check(len(errs) == 3, "schema should reject tensorParallelSize=0, policy=magic and a "
          f"non-http tracing endpoint, got {len(errs)} errors")
    # Template: a grace period shorter than preStop + drain does not render.
    bad.write_text("worker:\n  terminationGracePeriodSeconds: 30\n  drainTimeoutSeconds: 60\n")
    res = render(renderer, chart, [bad])
    check(res.returncode != 0 and "terminationGracePeriodSeconds" in res.stderr,
          f"short grace period must fail to render: rc={res.returncode} {res.stderr}")
    # Autoscaling bounds the wrong way round do not render.
    res = render(renderer, chart, [], extra=["--set", "worker.autoscaling.enabled=true", "--set",
                                             "worker.autoscaling.minReplicas=5", "--set",
                                             "worker.autoscaling.maxReplicas=2"])
    check(res.returncode != 0 and "minReplicas" in res.stderr,
          f"minReplicas > maxReplicas must fail to render: rc={res.returncode} {res.stderr}")
    # source=pvc needs a claim; with one, the claim is mounted and no init container runs.
    res = render(renderer, chart, [], extra=["--set", "model.source=pvc"])
    check(res.returncode != 0 and "existingClaim" in res.stderr, "model.source=pvc without a claim must fail")
    res = render(renderer, chart, [], extra=["--set", "model.source=pvc", "--set", "model.existingClaim=models"])
    if check(res.returncode == 0, f"pvc render: {res.stderr}"):
        sts = [d for d in yaml.safe_load_all(res.stdout) if d and d["kind"] == "StatefulSet"][0]
        vols = sts["spec"]["template"]["spec"]["volumes"]
        check(any(v.get("persistentVolumeClaim", {}).get("claimName") == "models" for v in vols), "pvc volume")
        check("initContainers" not in sts["spec"]["template"]["spec"], "no fetch with pvc")


def repo_consistency(repo):
    gen = subprocess.run([sys.executable, str(repo / "deploy/grafana/generate_dashboard.py"), "--check"],
                         capture_output=True, text=True)
    check(gen.returncode == 0, f"dashboards out of date: {gen.stdout}{gen.stderr}")
    check((repo / "deploy/prometheus/rules.yml").read_bytes() ==
          (repo / "helm/tinyserve/rules/tinyserve.rules.yml").read_bytes(),
          "helm/tinyserve/rules/tinyserve.rules.yml must be a copy of deploy/prometheus/rules.yml")
    compose = yaml.safe_load((repo / "deploy/compose.yaml").read_text())
    services = compose.get("services", {})
    for s in ("router", "worker-0", "worker-1", "prometheus", "grafana", "fetch-model"):
        check(s in services, f"compose.yaml: service {s}")
    prom = yaml.safe_load((repo / "deploy/prometheus/prometheus.yml").read_text())
    targets = {t.split(":")[0] for job in prom["scrape_configs"] for sc in job.get("static_configs", [])
               for t in sc["targets"]}
    check({"router", "worker-0", "worker-1"} <= targets, f"prometheus.yml targets {targets} match compose")
    for f in (repo / "deploy/grafana/provisioning").rglob("*.yaml"):
        yaml.safe_load(f.read_text())
    # The adapter rule serves the metric the chart's HPA asks for by default.
    adapter = yaml.safe_load((repo / "deploy/prometheus/adapter-rules.yaml").read_text())
    default_metric = yaml.safe_load((repo / "helm/tinyserve/values.yaml").read_text())[
        "worker"]["autoscaling"]["metric"]
    check([r["name"]["as"] for r in adapter["rules"]["custom"]] == [default_metric],
          f"deploy/prometheus/adapter-rules.yaml serves {default_metric}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", required=True, type=pathlib.Path)
    ap.add_argument("--work", required=True, type=pathlib.Path)
    a = ap.parse_args()
    repo, chart = a.repo.resolve(), a.repo.resolve() / "helm/tinyserve"
    schema = json.loads((chart / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    renderer = build_renderer(repo, a.work)
    cases = [("default", [])] + [(f.stem, [f]) for f in sorted((chart / "ci").glob("*.yaml"))]
    check(any(n == "gpu-tp-values" for n, _ in cases), "helm/tinyserve/ci/gpu-tp-values.yaml exists")
    for name, files in cases:
        check_case(renderer, repo, chart, schema, name, files)
    negative_cases(renderer, chart, schema, a.work)
    repo_consistency(repo)
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed")
        return 1
    print("chart: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
