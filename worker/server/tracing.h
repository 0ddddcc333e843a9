// File: worker/server/tracing.h
// OpenTelemetry traces, exported over OTLP/HTTP with the JSON encoding (what an OpenTelemetry
// Collector, Jaeger or Tempo accept on port 4318 at /v1/traces):
//   - TraceContext: W3C trace context, "traceparent: 00-<trace id>-<span id>-<flags>", read from
//     gRPC metadata or an HTTP header and written onto outgoing calls;
//   - Span: one operation (a Generate on the router or on a worker) with attributes and a status;
//     a span that does not record (no tracer, or not sampled) still passes its parent's context
//     on, so a client's trace crosses a router that does not trace;
//   - Tracer: parent-based sampling (a parent's sampled flag is followed; a root is sampled with
//     sample_ratio), and a background thread that posts finished spans in batches (every second,
//     or at 256 spans). Its queue is bounded: spans are dropped, and counted, rather than block
//     serving; a failed post is logged once per minute.
// Thread safety: a Span belongs to one call at a time; Tracer is thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace tinyserve {

struct TraceContext {
  std::string trace_id;  // 32 lowercase hex digits; empty: no context
  std::string span_id;   // 16 lowercase hex digits
  bool sampled = false;
  bool valid() const { return !trace_id.empty(); }
  std::string Traceparent() const;
  // A traceparent header value; an invalid one (wrong length, not hex, all-zero ids, version ff)
  // gives a context that is not valid(), as the W3C spec says to ignore it.
  static TraceContext Parse(std::string_view traceparent);
};

// The call's "traceparent" metadata (not valid() when absent or malformed).
TraceContext TraceContextOf(const grpc::ServerContextBase& context);
// Adds "traceparent" to an outgoing call (nothing for a context that is not valid()).
void AttachTraceContext(const TraceContext& trace, grpc::ClientContext* context);

class Tracer;

class Span {
 public:
  enum Kind { kInternal = 1, kServer = 2, kClient = 3 };
  // Starts a span under `parent` (a new trace when parent is not valid()). With no tracer, or
  // when not sampled, the span records nothing and its context() is its parent's.
  static std::unique_ptr<Span> Start(Tracer* tracer, std::string name, Kind kind,
                                     const TraceContext& parent);
  ~Span();  // ends the span if End was not called

  bool recording() const { return tracer_ != nullptr; }
  // What a child (an outgoing call) continues: this span, or the parent passed through.
  const TraceContext& context() const { return context_; }
  void Set(const std::string& key, const std::string& value);
  void Set(const std::string& key, const char* value) { Set(key, std::string(value)); }
  void Set(const std::string& key, int64_t value);
  void Set(const std::string& key, double value);
  void Set(const std::string& key, bool value);
  void SetError(const std::string& message);  // status ERROR with this message
  // Ends the span (its end time) and hands it to the exporter; later calls do nothing.
  void End();

 private:
  Span() = default;
  Tracer* tracer_ = nullptr;
  TraceContext context_;
  std::string parent_span_id_;
  std::string name_;
  Kind kind_ = kInternal;
  uint64_t start_ns_ = 0;
  nlohmann::json attributes_ = nlohmann::json::array();
  int status_code_ = 0;  // 0 unset, 1 ok, 2 error
  std::string status_message_;
  bool ended_ = false;
};

struct TracerOptions {
  std::string endpoint;  // http://host:port[/path] (default path /v1/traces); empty: off
  std::string service_name;
  std::string service_version;
  double sample_ratio = 1.0;  // of traces started here (a parent's decision is followed)
  int max_queue = 4096;       // finished spans waiting for export; more are dropped
};

class Tracer {
 public:
  // nullptr (and OK) when options.endpoint is empty. INVALID_ARGUMENT naming
  // --otlp-traces-endpoint for a URL it cannot post to (only http:// is supported).
  static absl::StatusOr<std::unique_ptr<Tracer>> Create(const TracerOptions& options);
  // Posts what is queued, unless the last post failed (a post takes 10 s at most, name
  // resolution aside), then stops.
  ~Tracer();

  bool Sample(const TraceContext& parent);
  int64_t exported() const;  // spans the endpoint accepted
  int64_t dropped() const;   // spans lost: queue full or a failed post
  // Counts them in tinyserve_trace_spans_total{result="exported"|"dropped"} too.
  void BindMetrics(prometheus::Registry* registry);

 private:
  friend class Span;
  explicit Tracer(const TracerOptions& options);
  void Enqueue(nlohmann::json span);
  void Loop();
  bool Post(const std::string& body, std::string* error);

  TracerOptions options_;
  std::string host_, path_;
  int port_ = 0;
  nlohmann::json resource_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<nlohmann::json> queue_;   // GUARDED_BY(mu_)
  bool stop_ = false;                   // GUARDED_BY(mu_)
  int64_t exported_ = 0, dropped_ = 0;  // GUARDED_BY(mu_)
  prometheus::Counter* exported_counter_ = nullptr;  // set before spans flow (BindMetrics)
  prometheus::Counter* dropped_counter_ = nullptr;
  double last_error_log_ = -1e9;
  bool last_post_ok_ = true;  // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace tinyserve
