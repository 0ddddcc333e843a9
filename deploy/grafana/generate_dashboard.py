#!/usr/bin/env python3
"""Generates the TinyServe Grafana dashboard (deploy/grafana/dashboards/tinyserve.json) and its copy
in the Helm chart (helm/tinyserve/dashboards/tinyserve.json).

  python3 deploy/grafana/generate_dashboard.py          # write both files
  python3 deploy/grafana/generate_dashboard.py --check  # exit 1 if either is out of date

Metric names are those of docs/METRICS.md; tests/deploy checks each one against live scrapes.
"""
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUTPUTS = [ROOT / "deploy/grafana/dashboards/tinyserve.json",
           ROOT / "helm/tinyserve/dashboards/tinyserve.json"]

DS = {"type": "prometheus", "uid": "${datasource}"}
W = '{instance=~"$instance"}'          # worker selector (template variable)
R = '{instance=~"$router"}'            # router selector
RI = "[$__rate_interval]"


def q(p, sel, metric):
    return (f"histogram_quantile({p}, sum by (le) (rate({metric}_bucket{sel}{RI})))")


class Builder:
    def __init__(self):
        self.panels = []
        self.next_id = 1
        self.y = 0
        self.x = 0
        self.row_h = 0

    def _id(self):
        i = self.next_id
        self.next_id += 1
        return i

    def row(self, title, repeat=None):
        self._newline()
        p = {"type": "row", "title": title, "id": self._id(), "collapsed": False, "panels": [],
             "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}}
        if repeat:
            p["repeat"] = repeat
        self.panels.append(p)
        self.y += 1

    def _newline(self):
        if self.x:
            self.y += self.row_h
            self.x = 0
            self.row_h = 0

    def panel(self, title, targets, unit="short", w=8, h=8, kind="timeseries", desc="",
              minmax=None, stacked=False, step=False):
        if self.x + w > 24:
            self._newline()
        p = {
            "type": kind, "title": title, "id": self._id(), "datasource": DS,
            "description": desc,
            "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y},
            "targets": [{"refId": chr(ord("A") + i), "datasource": DS, "expr": e,
                         "legendFormat": l, "range": True}
                        for i, (e, l) in enumerate(targets)],
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "desc"}},
        }
        if kind == "timeseries":
            custom = {"lineWidth": 1, "fillOpacity": 10, "showPoints": "never"}
            if stacked:
                custom["stacking"] = {"mode": "normal", "group": "A"}
            if step:
                custom["lineInterpolation"] = "stepAfter"
            p["fieldConfig"]["defaults"]["custom"] = custom
        if kind == "stat":
            p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                            "colorMode": "value", "graphMode": "area", "textMode": "auto"}
        if minmax:
            p["fieldConfig"]["defaults"]["min"], p["fieldConfig"]["defaults"]["max"] = minmax
        self.panels.append(p)
        self.x += w
        self.row_h = max(self.row_h, h)


def build():
    b = Builder()
    b.row("Overview")
    b.panel("Healthy workers (router view)",
            [(f"sum(max by (worker) (tinyserve_router_worker_healthy{R}))", "healthy"),
             (f"max(tinyserve_router_workers{R})", "known")], kind="stat", w=4, h=6)
    b.panel("Workers ready",
            [(f"sum(tinyserve_worker_ready{W})", "ready"), ("count(up{job=~\".*worker.*\"} == 1)", "up")],
            kind="stat", w=4, h=6)
    b.panel("Requests/s (router)", [(f"sum(rate(tinyserve_router_requests_total{R}{RI}))", "req/s")],
            unit="reqps", kind="stat", w=4, h=6)
    b.panel("Generated tokens/s", [(f"sum(rate(tinyserve_generation_tokens_total{W}{RI}))", "tokens/s")],
            kind="stat", w=4, h=6)
    b.panel("TTFT p99 (router)",
            [(q(0.99, R, "tinyserve_router_time_to_first_token_seconds"), "p99")], unit="s", kind="stat", w=4, h=6)
    b.panel("KV usage (max worker)", [(f"max(tinyserve_kv_usage_ratio{W})", "max")], unit="percentunit",
            kind="stat", w=4, h=6, minmax=(0, 1))

    b.row("Requests and latency")
    b.panel("Worker requests by outcome",
            [(f"sum by (outcome) (rate(tinyserve_requests_total{W}{RI}))", "{{outcome}}")],
            unit="reqps", stacked=True,
            desc="Finished requests per second by outcome (stop, length, abort, deadline, error, invalid, rejected).")
    b.panel("Router requests by outcome",
            [(f"sum by (outcome) (rate(tinyserve_router_requests_total{R}{RI}))", "{{outcome}}")],
            unit="reqps", stacked=True)
    b.panel("Tokens/s",
            [(f"sum(rate(tinyserve_generation_tokens_total{W}{RI}))", "generated"),
             (f"sum(rate(tinyserve_prompt_tokens_total{W}{RI}))", "prompt")], unit="short")
    b.panel("Time to first token",
            [(q(0.5, W, "tinyserve_time_to_first_token_seconds"), "worker p50"),
             (q(0.99, W, "tinyserve_time_to_first_token_seconds"), "worker p99"),
             (q(0.5, R, "tinyserve_router_time_to_first_token_seconds"), "router p50"),
             (q(0.99, R, "tinyserve_router_time_to_first_token_seconds"), "router p99")], unit="s")
    b.panel("Inter-token latency",
            [(q(0.5, W, "tinyserve_inter_token_latency_seconds"), "p50"),
             (q(0.99, W, "tinyserve_inter_token_latency_seconds"), "p99")], unit="s")
    b.panel("End-to-end latency",
            [(q(0.5, W, "tinyserve_e2e_request_latency_seconds"), "worker p50"),
             (q(0.99, W, "tinyserve_e2e_request_latency_seconds"), "worker p99"),
             (q(0.99, R, "tinyserve_router_request_latency_seconds"), "router p99")], unit="s")

    b.row("Scheduler queue and KV cache")
    b.panel("Running and waiting requests",
            [(f"sum(tinyserve_requests_running{W})", "running"),
             (f"sum(tinyserve_requests_waiting{W})", "waiting"),
             (f"sum(tinyserve_router_requests_waiting{R})", "router waiting"),
             (f"sum(tinyserve_router_requests_running{R})", "router slots held")])
    b.panel("Queue, prefill and decode time",
            [(q(0.5, W, "tinyserve_request_queue_seconds"), "queue p50"),
             (q(0.99, W, "tinyserve_request_queue_seconds"), "queue p99"),
             (q(0.99, W, "tinyserve_request_prefill_seconds"), "prefill p99"),
             (q(0.99, W, "tinyserve_request_decode_seconds"), "decode p99")], unit="s")
    b.panel("KV usage by worker", [(f"tinyserve_kv_usage_ratio{W}", "{{instance}}")],
            unit="percentunit", minmax=(0, 1))
    b.panel("KV pages",
            [(f"sum(tinyserve_kv_pages_used{W})", "used"), (f"sum(tinyserve_kv_pages_free{W})", "free"),
             (f"sum(tinyserve_kv_pages_capacity{W})", "total")])
    b.panel("Preemptions/s", [(f"sum by (instance) (rate(tinyserve_preemptions_total{W}{RI}))", "{{instance}}")])
    b.panel("Prefix-cache hit rate",
            [(f"sum(rate(tinyserve_prefix_cache_hits_tokens_total{W}{RI})) / "
              f"sum(rate(tinyserve_prefix_cache_queries_tokens_total{W}{RI}))", "tokens"),
             (f"sum(rate(tinyserve_prefix_cache_hits_pages_total{W}{RI})) / "
              f"sum(rate(tinyserve_prefix_cache_queries_pages_total{W}{RI}))", "pages")],
            unit="percentunit", minmax=(0, 1), desc="rate(hits) / rate(queries)")
    b.panel("Tiered KV: device page-cache hit rate (cuda)",
            [(f"sum(rate(tinyserve_kv_tier_hits_pages_total{W}{RI})) / "
              f"(sum(rate(tinyserve_kv_tier_hits_pages_total{W}{RI})) + "
              f"sum(rate(tinyserve_kv_tier_misses_pages_total{W}{RI})))", "hit rate")],
            unit="percentunit", minmax=(0, 1),
            desc="Workers run with --device cuda --kv-device-pages N: needed pages found on the device.")
    b.panel("Tiered KV: bytes moved/s (cuda)",
            [(f"sum by (instance) (rate(tinyserve_kv_tier_moved_bytes_total{W}{RI}))", "copied {{instance}}"),
             (f"sum by (instance) (rate(tinyserve_kv_tier_direct_bytes_total{W}{RI}))", "read from host {{instance}}")],
            unit="Bps")
    b.panel("Speculative decoding: acceptance",
            [(f"sum(rate(tinyserve_spec_decode_accepted_tokens_total{W}{RI})) / "
              f"sum(rate(tinyserve_spec_decode_draft_tokens_total{W}{RI}))", "accepted / drafted"),
             (f"1 + sum(rate(tinyserve_spec_decode_accepted_tokens_total{W}{RI})) / "
              f"sum(rate(tinyserve_spec_decode_drafts_total{W}{RI}))", "tokens per verify step")],
            desc="Workers run with --spec-tokens N: the share of drafted tokens the model agreed "
                 "with, and the tokens one verifying step emits on average.")
    b.panel("LoRA adapters: requests/s",
            [(f"sum by (adapter) (rate(tinyserve_lora_requests_total{W}{RI}))", "{{adapter}}")],
            unit="reqps",
            desc="Requests admitted with each LoRA adapter (workers started with --lora NAME=PATH, "
                 "or loaded at run time; empty without adapters).")
    b.panel("Embeddings: inputs/s",
            [(f"sum(rate(tinyserve_embedding_inputs_total{W}{RI}))", "inputs")],
            desc="Inputs embedded by Embed calls (/v1/embeddings); each is also a finished request "
                 "in the request and prompt-token panels.")

    b.row("Sparse attention (page selection)")
    b.panel("Page hit rate vs oracle (avg)",
            [(f"sum by (policy) (rate(tinyserve_selection_page_hit_rate_sum{W}{RI})) / "
              f"sum by (policy) (rate(tinyserve_selection_page_hit_rate_count{W}{RI}))", "{{policy}}")],
            unit="percentunit", minmax=(0, 1),
            desc="Sampled share of the oracle's top pages that the policy chose (histogram sum / count).")
    b.panel("Attention-mass recall (avg)",
            [(f"sum by (policy) (rate(tinyserve_selection_mass_recall_sum{W}{RI})) / "
              f"sum by (policy) (rate(tinyserve_selection_mass_recall_count{W}{RI}))", "{{policy}}")],
            unit="percentunit", minmax=(0, 1))
    b.panel("KV bytes saved vs dense",
            [(f"1 - sum by (policy) (rate(tinyserve_selection_kv_bytes_read_total{W}{RI})) / "
              f"sum by (policy) (rate(tinyserve_selection_kv_bytes_dense_total{W}{RI}))", "{{policy}}")],
            unit="percentunit", minmax=(0, 1), desc="1 - rate(KV bytes read) / rate(KV bytes dense would read)")
    b.panel("Pages selected / scored",
            [(f"sum by (policy) (rate(tinyserve_selection_pages_selected_total{W}{RI})) / "
              f"sum by (policy) (rate(tinyserve_selection_pages_scored_total{W}{RI}))", "{{policy}}")],
            unit="percentunit", minmax=(0, 1))
    b.panel("Selection steps/s", [(f"sum by (policy) (rate(tinyserve_selection_steps_total{W}{RI}))", "{{policy}}")])
    b.panel("Engine step time",
            [(q(0.5, W, "tinyserve_engine_step_seconds"), "p50"),
             (q(0.99, W, "tinyserve_engine_step_seconds"), "p99"),
             (f"sum(rate(tinyserve_engine_steps_total{W}{RI}))", "steps/s")], unit="s")

    b.row("Router")
    b.panel("Retries and migrations/s",
            [(f"sum(rate(tinyserve_router_retries_total{R}{RI}))", "retries"),
             (f"sum(rate(tinyserve_router_migrations_total{R}{RI}))", "migrations")])
    b.panel("LoRA adapter syncs/s",
            [(f"sum by (op, result) (rate(tinyserve_router_lora_syncs_total{R}{RI}))",
              "{{op}} {{result}}")],
            desc="Run-time LoRA loads and unloads the router made to bring a worker in line (one "
                 "that joined or restarted after a load, or missed an unload); errors repeat every "
                 "10 s until the worker can load the file (router log).")
    b.panel("Routing decisions by reason",
            [(f"sum by (reason) (rate(tinyserve_router_routing_decisions_total{R}{RI}))", "{{reason}}")],
            stacked=True)
    b.panel("In flight per worker", [(f"sum by (worker) (tinyserve_router_worker_inflight{R})", "{{worker}}")])
    b.panel("Worker health (1 = serving)", [(f"min by (worker) (tinyserve_router_worker_healthy{R})", "{{worker}}")],
            minmax=(0, 1), step=True, w=12)
    b.panel("Circuit breaker open, model mismatch",
            [(f"max by (worker) (tinyserve_router_circuit_open{R})", "{{worker}} breaker"),
             (f"max by (worker) (tinyserve_router_worker_model_mismatch{R})", "{{worker}} model")],
            minmax=(0, 1), step=True, w=12,
            desc="A worker the router does not send to: its breaker opened after failures, or it "
                 "serves another model than most of the router's workers.")
    b.panel("OpenAI HTTP API requests/s by route and status",
            [(f"sum by (route, code) (rate(tinyserve_http_requests_total{R}{RI}))", "{{route}} {{code}}")],
            stacked=True, w=24, desc="The router's OpenAI-compatible HTTP API (docs/HTTP_API.md).")

    b.row("Worker $instance", repeat="instance")
    one = '{instance="$instance"}'
    b.panel("TTFT and ITL p99",
            [(q(0.99, one, "tinyserve_time_to_first_token_seconds"), "TTFT p99"),
             (q(0.99, one, "tinyserve_inter_token_latency_seconds"), "ITL p99")], unit="s", w=6)
    b.panel("Tokens/s", [(f"rate(tinyserve_generation_tokens_total{one}{RI})", "generated")], w=6)
    b.panel("Running / waiting",
            [(f"tinyserve_requests_running{one}", "running"), (f"tinyserve_requests_waiting{one}", "waiting"),
             (f"tinyserve_worker_ready{one}", "ready")], w=6)
    b.panel("KV usage", [(f"tinyserve_kv_usage_ratio{one}", "usage")], unit="percentunit", minmax=(0, 1), w=6)
    return b.panels


def dashboard():
    return {
        "uid": "tinyserve-overview",
        "title": "TinyServe",
        "tags": ["tinyserve", "llm"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0, "refresh": 1, "options": []},
            {"name": "instance", "label": "Worker", "type": "query", "datasource": DS,
             "query": {"query": "label_values(tinyserve_worker_ready, instance)", "refId": "A"},
             "definition": "label_values(tinyserve_worker_ready, instance)",
             "multi": True, "includeAll": True, "allValue": ".+", "current": {}, "refresh": 2,
             "sort": 1, "hide": 0, "options": []},
            {"name": "router", "label": "Router", "type": "query", "datasource": DS,
             "query": {"query": "label_values(tinyserve_router_workers, instance)", "refId": "B"},
             "definition": "label_values(tinyserve_router_workers, instance)",
             "multi": True, "includeAll": True, "allValue": ".+", "current": {}, "refresh": 2,
             "sort": 1, "hide": 0, "options": []},
        ]},
        "panels": build(),
    }


def main():
    text = json.dumps(dashboard(), indent=2, sort_keys=False) + "\n"
    stale = [p for p in OUTPUTS if not p.exists() or p.read_text() != text]
    if "--check" in sys.argv:
        for p in stale:
            print(f"{p.relative_to(ROOT)} is out of date: run {pathlib.Path(__file__).relative_to(ROOT)}")
        return 1 if stale else 0
    for p in OUTPUTS:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
