#include "worker/server/tracing.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/timer.h"

namespace tinyserve {
namespace {

using json = nlohmann::json;

std::mt19937_64& Rng() {
  thread_local std::mt19937_64 rng([] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
           static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }());
  return rng;
}

// n random bytes as 2n lowercase hex digits, not all zero.
std::string RandomHex(int n) {
  static const char kHex[] = "0123456789abcdef";
  for (;;) {
    std::string s;
    bool zero = true;
    for (int i = 0; i < n; i += 8) {
      uint64_t v = Rng()();
      for (int j = 0; j < 8 && i + j < n; ++j, v >>= 8) {
        const unsigned b = v & 0xff;
        zero &= b == 0;
        s.push_back(kHex[b >> 4]);
        s.push_back(kHex[b & 15]);
      }
    }
    if (!zero) return s;
  }
}

bool IsLowerHex(std::string_view s) {
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

uint64_t UnixNanos() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

json Attribute(const std::string& key, json value) {
  return json{{"key", key}, {"value", std::move(value)}};
}

}  // namespace

std::string TraceContext::Traceparent() const {
  return absl::StrCat("00-", trace_id, "-", span_id, sampled ? "-01" : "-00");
}

TraceContext TraceContext::Parse(std::string_view v) {
  TraceContext t;
  // version "-" trace-id(32) "-" parent-id(16) "-" flags(2); later versions may append fields.
  if (v.size() < 55 || v[2] != '-' || v[35] != '-' || v[52] != '-') return t;
  if (v.size() > 55 && (v.substr(0, 2) == "00" || v[55] != '-')) return t;
  const std::string_view version = v.substr(0, 2), trace = v.substr(3, 32), span = v.substr(36, 16),
                         flags = v.substr(53, 2);
  if (!IsLowerHex(version) || version == "ff" || !IsLowerHex(trace) || !IsLowerHex(span) ||
      !IsLowerHex(flags))
    return t;
  if (trace == std::string(32, '0') || span == std::string(16, '0')) return t;
  t.trace_id = std::string(trace);
  t.span_id = std::string(span);
  const int f = (flags[1] >= 'a' ? flags[1] - 'a' + 10 : flags[1] - '0');
  t.sampled = (f & 1) != 0;
  return t;
}

TraceContext TraceContextOf(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("traceparent");
  if (it == metadata.end()) return TraceContext();
  return TraceContext::Parse(std::string_view(it->second.data(), it->second.size()));
}

void AttachTraceContext(const TraceContext& trace, grpc::ClientContext* context) {
  if (trace.valid()) context->AddMetadata("traceparent", trace.Traceparent());
}

std::unique_ptr<Span> Span::Start(Tracer* tracer, std::string name, Kind kind,
                                  const TraceContext& parent) {
  std::unique_ptr<Span> s(new Span());
  s->context_ = parent;
  if (tracer == nullptr) return s;
  const bool sampled = tracer->Sample(parent);
  s->context_.trace_id = parent.valid() ? parent.trace_id : RandomHex(16);
  s->context_.span_id = RandomHex(8);
  s->context_.sampled = sampled;
  if (!sampled) return s;  // not recorded; children learn the decision from the flags
  s->tracer_ = tracer;
  s->parent_span_id_ = parent.valid() ? parent.span_id : std::string();
  s->name_ = std::move(name);
  s->kind_ = kind;
  s->start_ns_ = UnixNanos();
  return s;
}

Span::~Span() { End(); }

void Span::Set(const std::string& key, const std::string& value) {
  if (recording()) attributes_.push_back(Attribute(key, json{{"stringValue", value}}));
}

void Span::Set(const std::string& key, int64_t value) {
  // OTLP JSON writes 64-bit integers as strings.
  if (recording()) attributes_.push_back(Attribute(key, json{{"intValue", std::to_string(value)}}));
}

void Span::Set(const std::string& key, double value) {
  if (recording()) attributes_.push_back(Attribute(key, json{{"doubleValue", value}}));
}

void Span::Set(const std::string& key, bool value) {
  if (recording()) attributes_.push_back(Attribute(key, json{{"boolValue", value}}));
}

void Span::SetError(const std::string& message) {
  status_code_ = 2;
  status_message_ = message;
}

void Span::End() {
  if (ended_ || !recording()) {
    ended_ = true;
    return;
  }
  ended_ = true;
  json span = {{"traceId", context_.trace_id},
               {"spanId", context_.span_id},
               {"name", name_},
               {"kind", static_cast<int>(kind_)},
               {"startTimeUnixNano", std::to_string(start_ns_)},
               {"endTimeUnixNano", std::to_string(UnixNanos())},
               {"attributes", std::move(attributes_)},
               {"status", {{"code", status_code_}}}};
  if (!parent_span_id_.empty()) span["parentSpanId"] = parent_span_id_;
  if (!status_message_.empty()) span["status"]["message"] = status_message_;
  tracer_->Enqueue(std::move(span));
}

absl::StatusOr<std::unique_ptr<Tracer>> Tracer::Create(const TracerOptions& options) {
  if (options.endpoint.empty()) return std::unique_ptr<Tracer>();
  const std::string& url = options.endpoint;
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("--otlp-traces-endpoint: '", url, "' ", why));
  };
  constexpr std::string_view kScheme = "http://";
  if (url.compare(0, kScheme.size(), kScheme) != 0) {
    return bad("is not an http:// URL (OTLP/HTTP, e.g. http://localhost:4318/v1/traces)");
  }
  if (options.sample_ratio < 0 || options.sample_ratio > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--trace-sample-ratio: must be in [0, 1], got ", options.sample_ratio));
  }
  std::unique_ptr<Tracer> t(new Tracer(options));
  const std::string rest = url.substr(kScheme.size());
  const size_t slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  t->path_ =
      slash == std::string::npos || slash + 1 == rest.size() ? "/v1/traces" : rest.substr(slash);
  const size_t colon = authority.rfind(':');
  t->host_ = authority.substr(0, colon);
  if (t->host_.size() > 2 && t->host_.front() == '[' && t->host_.back() == ']') {
    t->host_ = t->host_.substr(1, t->host_.size() - 2);  // an IPv6 literal
  }
  t->port_ = 80;
  if (colon != std::string::npos && (!absl::SimpleAtoi(authority.substr(colon + 1), &t->port_) ||
                                     t->port_ <= 0 || t->port_ > 65535)) {
    return bad("has no valid port");
  }
  if (t->host_.empty()) return bad("has no host");
  t->thread_ = std::thread([p = t.get()] { p->Loop(); });
  return t;
}

Tracer::Tracer(const TracerOptions& options) : options_(options) {
  json attrs = json::array({Attribute("service.name", {{"stringValue", options.service_name}}),
                            Attribute("telemetry.sdk.name", {{"stringValue", "tinyserve"}}),
                            Attribute("telemetry.sdk.language", {{"stringValue", "cpp"}})});
  if (!options.service_version.empty())
    attrs.push_back(Attribute("service.version", {{"stringValue", options.service_version}}));
  resource_ = {{"attributes", std::move(attrs)}};
}

Tracer::~Tracer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Tracer::Sample(const TraceContext& parent) {
  if (parent.valid()) return parent.sampled;
  if (options_.sample_ratio >= 1) return true;
  return std::uniform_real_distribution<double>(0, 1)(Rng()) < options_.sample_ratio;
}

int64_t Tracer::exported() const {
  std::lock_guard<std::mutex> lock(mu_);
  return exported_;
}

int64_t Tracer::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

void Tracer::BindMetrics(prometheus::Registry* registry) {
  auto& family = prometheus::BuildCounter()
                     .Name("tinyserve_trace_spans_total")
                     .Help(
                         "OpenTelemetry spans finished here, by what became of them (exported: "
                         "the collector accepted them; dropped: queue full or a failed post)")
                     .Register(*registry);
  std::lock_guard<std::mutex> lock(mu_);
  exported_counter_ = &family.Add({{"result", "exported"}});
  dropped_counter_ = &family.Add({{"result", "dropped"}});
}

void Tracer::Enqueue(json span) {
  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<int>(queue_.size()) >= options_.max_queue) {
    ++dropped_;
    if (dropped_counter_ != nullptr) dropped_counter_->Increment();
    return;
  }
  queue_.push_back(std::move(span));
  if (queue_.size() >= 256) cv_.notify_one();
}

void Tracer::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait_for(lock, std::chrono::seconds(1), [&] { return stop_ || queue_.size() >= 256; });
    if (queue_.empty()) {
      if (stop_) return;
      continue;
    }
    std::vector<json> batch;
    batch.swap(queue_);
    if (stop_ && !last_post_ok_) {  // shutting down, and the collector was not there just now
      dropped_ += static_cast<int64_t>(batch.size());
      if (dropped_counter_ != nullptr) dropped_counter_->Increment(batch.size());
      return;
    }
    lock.unlock();
    const int64_t n = static_cast<int64_t>(batch.size());
    const json body = {
        {"resourceSpans",
         json::array(
             {{{"resource", resource_},
               {"scopeSpans",
                json::array(
                    {{{"scope", {{"name", "tinyserve"}, {"version", options_.service_version}}},
                      {"spans", std::move(batch)}}})}}})}};
    std::string error;
    const bool ok = Post(body.dump(-1, ' ', false, json::error_handler_t::replace), &error);
    lock.lock();
    last_post_ok_ = ok;
    if (ok) {
      exported_ += n;
      if (exported_counter_ != nullptr) exported_counter_->Increment(static_cast<double>(n));
    } else {
      dropped_ += n;
      if (dropped_counter_ != nullptr) dropped_counter_->Increment(static_cast<double>(n));
      if (NowSeconds() - last_error_log_ > 60) {
        last_error_log_ = NowSeconds();
        TS_LOG(WARNING) << "tracing: posting " << n << " spans to " << options_.endpoint
                        << " failed: " << error << " (logged once a minute)";
      }
    }
  }
}

namespace {

constexpr auto kConnectTimeout = std::chrono::seconds(2);
constexpr auto kPostTimeout = std::chrono::seconds(10);  // the whole post, connect included

using Clock = std::chrono::steady_clock;

int MillisLeft(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

// Waits until fd is ready for `events` or the deadline passes.
bool Ready(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, MillisLeft(deadline));
    if (n > 0) return true;
    if (n == 0 || errno != EINTR) return false;
  }
}

// A connected, non-blocking TCP socket to `a` by the deadline, or -1 with `error` set.
int ConnectBy(const addrinfo* a, Clock::time_point deadline, std::string* error) {
  const int fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *error = absl::StrCat("socket: ", std::strerror(errno));
    return -1;
  }
  int err = connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
  if (err == EINPROGRESS) {
    socklen_t len = sizeof(err);
    if (!Ready(fd, POLLOUT, deadline)) {
      err = ETIMEDOUT;
    } else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
      err = errno;
    }
  }
  if (err != 0) {
    *error = absl::StrCat("connect: ", std::strerror(err));
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

// One POST on a fresh connection within kPostTimeout (each address tried at most
// kConnectTimeout), so a black-holed, stalled or trickling collector neither blocks the
// exporter long nor holds up shutdown; name resolution is the system resolver's (its own
// timeouts). Only the status line is read (Connection: close).
bool Tracer::Post(const std::string& body, std::string* error) {
  const Clock::time_point deadline = Clock::now() + kPostTimeout;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &found);
  if (rc != 0) {
    *error = absl::StrCat("resolving ", host_, ": ", gai_strerror(rc));
    return false;
  }
  int fd = -1;
  for (const addrinfo* a = found; a != nullptr && fd < 0 && MillisLeft(deadline) > 0;
       a = a->ai_next) {
    fd = ConnectBy(a, std::min(deadline, Clock::now() + kConnectTimeout), error);
  }
  freeaddrinfo(found);
  if (fd < 0) {
    if (error->empty()) *error = "connect: timed out";
    return false;
  }
  const bool ipv6 = host_.find(':') != std::string::npos;  // a literal: [::1]:4318
  const std::string request = absl::StrCat(
      "POST ", path_, " HTTP/1.1\r\nHost: ", ipv6 ? "[" : "", host_, ipv6 ? "]" : "", ":", port_,
      "\r\nContent-Type: application/json\r\nContent-Length: ", body.size(),
      "\r\nConnection: close\r\n\r\n", body);
  bool ok = true;
  for (size_t sent = 0; ok && sent < request.size();) {
    const ssize_t n = Ready(fd, POLLOUT, deadline)
                          ? send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL)
                          : -2;
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n == -1 && (errno == EINTR || errno == EAGAIN)) {
      continue;
    } else {
      *error = n == -2 ? "send: timed out" : absl::StrCat("send: ", std::strerror(errno));
      ok = false;
    }
  }
  // "HTTP/1.1 200 OK\r\n": the status is the three digits after the first space.
  std::string head;
  while (ok && head.find("\r\n") == std::string::npos && head.size() < 256) {
    char buf[256];
    const ssize_t n = Ready(fd, POLLIN, deadline) ? recv(fd, buf, sizeof(buf), 0) : -2;
    if (n > 0) {
      head.append(buf, static_cast<size_t>(n));
    } else if (n == -1 && (errno == EINTR || errno == EAGAIN)) {
      continue;
    } else {
      *error = n == 0    ? "the collector closed the connection without an answer"
               : n == -2 ? "no answer in time"
                         : absl::StrCat("no answer: ", std::strerror(errno));
      ok = false;
    }
  }
  close(fd);
  if (!ok) return false;
  const size_t space = head.find(' ');
  int status = 0;
  if (head.compare(0, 5, "HTTP/") != 0 || space == std::string::npos ||
      !absl::SimpleAtoi(head.substr(space + 1, 3), &status)) {
    *error = "not an HTTP answer";
    return false;
  }
  if (status < 200 || status >= 300) {
    *error = absl::StrCat("HTTP ", status);
    return false;
  }
  return true;
}

}  // namespace tinyserve
