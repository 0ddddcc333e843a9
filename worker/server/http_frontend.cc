#include "worker/server/http_frontend.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "common/timer.h"
#include "prometheus/text_serializer.h"
#include "worker/server/anthropic_api.h"
#include "worker/server/openai_responses.h"
#include "worker/server/rpc_security.h"
#include "worker/server/status_convert.h"
#include "worker/server/tracing.h"

namespace tinyserve {
namespace {

using json = nlohmann::ordered_json;
namespace v1 = tinyserve::v1;

constexpr auto kUnaryTimeout = std::chrono::seconds(30);

// The Generate calls of one HTTP request, run concurrently through the callback API; their
// messages and endings come out of Next() in arrival order.
class CallGroup {
 public:
  struct Event {
    int index = 0;
    bool done = false;  // the call ended with `status`
    v1::GenerateResponse response;
    grpc::Status status;
  };

  CallGroup(v1::TinyServe::Stub* stub, const std::vector<v1::GenerateRequest>& requests,
            const std::string& api_key, const TraceContext& trace)
      : remaining_(static_cast<int>(requests.size())) {
    for (size_t i = 0; i < requests.size(); ++i) {
      calls_.push_back(std::make_unique<Call>(this, static_cast<int>(i), requests[i]));
      AttachApiKey(api_key, &calls_.back()->context);
      AttachTraceContext(trace, &calls_.back()->context);  // the client's traceparent, if any
    }
    for (auto& call : calls_) call->Start(stub);
  }
  // Cancels what still runs and waits until every call has ended (their reactors are ours).
  ~CallGroup() {
    Cancel();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return remaining_ == 0; });
  }

  enum class Wait { kEvent, kTimeout, kEnd };
  // The next event, waiting at most `timeout`; kEnd once every call has ended and every event
  // was taken.
  Wait Next(Event* event, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [this] { return !events_.empty() || remaining_ == 0; })) {
      return Wait::kTimeout;
    }
    if (events_.empty()) return Wait::kEnd;
    *event = std::move(events_.front());
    events_.pop_front();
    return Wait::kEvent;
  }
  void Cancel() {
    for (auto& call : calls_) call->context.TryCancel();
  }

 private:
  struct Call final : grpc::ClientReadReactor<v1::GenerateResponse> {
    Call(CallGroup* g, int i, const v1::GenerateRequest& r) : group(g), index(i), request(r) {}
    void Start(v1::TinyServe::Stub* stub) {
      stub->async()->Generate(&context, &request, this);
      StartRead(&response);
      StartCall();
    }
    void OnReadDone(bool ok) override {
      if (!ok) return;  // OnDone follows
      group->Push({index, false, response, grpc::Status::OK});
      StartRead(&response);
    }
    // The last reaction: after Push the group may delete this object.
    void OnDone(const grpc::Status& status) override {
      group->Push({index, true, v1::GenerateResponse(), status});
    }

    CallGroup* group;
    int index;
    grpc::ClientContext context;
    v1::GenerateRequest request;
    v1::GenerateResponse response;
  };

  void Push(Event event) {
    std::lock_guard<std::mutex> lock(mu_);
    if (event.done) --remaining_;
    events_.push_back(std::move(event));
    cv_.notify_all();
  }

  std::vector<std::unique_ptr<Call>> calls_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;  // GUARDED_BY(mu_)
  int remaining_;             // GUARDED_BY(mu_)
};

int SendBody(mg_connection* conn, int status, const std::string& body,
             const char* type = "application/json") {
  mg_response_header_start(conn, status);
  mg_response_header_add(conn, "Content-Type", type, -1);
  mg_response_header_add(conn, "Content-Length", std::to_string(body.size()).c_str(), -1);
  mg_response_header_send(conn);
  mg_write(conn, body.data(), body.size());
  return status;
}

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

int SendError(mg_connection* conn, const grpc::Status& status,
              std::optional<std::string> param = std::nullopt) {
  return SendBody(conn, openai::HttpStatusOf(status.error_code()),
                  Dump(openai::ErrorBody(status, param)));
}

int SendError(mg_connection* conn, const absl::Status& status) {
  const int http = openai::HttpStatusOf(static_cast<grpc::StatusCode>(status.code()));
  return SendBody(conn, http, Dump(openai::ErrorBody(status)));
}

// The same in the shape of Anthropic's API (/v1/messages).
int SendAnthropicError(mg_connection* conn, const absl::Status& status) {
  const int http = openai::HttpStatusOf(static_cast<grpc::StatusCode>(status.code()));
  return SendBody(conn, http, Dump(openai::AnthropicErrorBody(status)));
}

int SendError(mg_connection* conn, int http, const std::string& message, const char* type) {
  json body = {
      {"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}}}};
  return SendBody(conn, http, Dump(body));
}

bool SendChunk(mg_connection* conn, const std::string& data) {
  return data.empty() || mg_send_chunk(conn, data.data(), static_cast<unsigned>(data.size())) > 0;
}

// The port and numeric address of a socket's local (peer = false) or remote end.
bool EndOf(int fd, bool peer, int* port, std::string* address) {
  sockaddr_storage sa{};
  socklen_t len = sizeof(sa);
  sockaddr* p = reinterpret_cast<sockaddr*>(&sa);
  if ((peer ? getpeername(fd, p, &len) : getsockname(fd, p, &len)) != 0) return false;
  char text[INET6_ADDRSTRLEN] = "";
  if (sa.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&sa);
    *port = ntohs(in->sin_port);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
  } else if (sa.ss_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(&sa);
    *port = ntohs(in->sin6_port);
    inet_ntop(AF_INET6, &in->sin6_addr, text, sizeof(text));
  } else {
    return false;
  }
  *address = text;
  return true;
}

// The socket of an HTTP connection, or -1. civetweb does not expose it, so it is found among
// the process's open files as the TCP socket with this request's local port and peer address
// (unique while the request runs: civetweb owns the socket until the handler returns).
int ConnectionSocket(const mg_request_info* ri) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    int port = 0;
    std::string address;
    if (!EndOf(static_cast<int>(fd), false, &port, &address) || port != ri->server_port) continue;
    if (!EndOf(static_cast<int>(fd), true, &port, &address) || port != ri->remote_port ||
        address != ri->remote_addr) {
      continue;
    }
    found = static_cast<int>(fd);
    break;
  }
  closedir(dir);
  return found;
}

// Whether the client closed or reset its connection: a peek that finds the end of the stream
// or an error, not data or nothing yet (a client waiting for its answer sends nothing).
bool PeerClosed(int fd) {
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

// How often a request that is waiting for tokens checks that its client is still there.
constexpr auto kDisconnectPoll = std::chrono::milliseconds(200);

// A unary call to the in-process server: a deadline, and the API key (the HTTP request has
// shown it already; the gRPC service checks it again).
void PrepareUnary(grpc::ClientContext* ctx, const std::string& api_key) {
  ctx->set_deadline(std::chrono::system_clock::now() + kUnaryTimeout);
  AttachApiKey(api_key, ctx);
}

grpc::Status ShuttingDown() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down");
}

}  // namespace

// Open (true) unless the frontend is closing; while open, BeginShutdown waits for Done() or the
// scope's end, and first cancels `unary` (a blocking call's context; TryCancel before the call
// exists cancels it as it starts).
class HttpFrontend::CallScope {
 public:
  explicit CallScope(HttpFrontend* f, grpc::ClientContext* unary = nullptr) : f_(f), unary_(unary) {
    std::lock_guard<std::mutex> lock(f_->gate_mu_);
    open_ = !f_->closing_;
    if (!open_) return;
    ++f_->calling_;
    if (unary_ != nullptr) f_->unary_.insert(unary_);
  }
  ~CallScope() { Done(); }
  explicit operator bool() const { return open_; }
  void Done() {
    if (!open_) return;
    open_ = false;
    std::lock_guard<std::mutex> lock(f_->gate_mu_);
    if (unary_ != nullptr) f_->unary_.erase(unary_);
    if (--f_->calling_ == 0) f_->gate_cv_.notify_all();
  }

 private:
  HttpFrontend* f_;
  grpc::ClientContext* unary_;
  bool open_ = false;
};

void HttpFrontend::BeginShutdown() {
  std::unique_lock<std::mutex> lock(gate_mu_);
  closing_ = true;
  for (grpc::ClientContext* ctx : unary_) ctx->TryCancel();
  gate_cv_.wait(lock, [this] { return calling_ == 0; });
}

HttpFrontend::HttpFrontend(const HttpFrontendOptions& options,
                           std::shared_ptr<grpc::Channel> channel, prometheus::Registry* registry,
                           std::shared_ptr<prometheus::Collectable> metrics)
    : options_(options),
      channel_(std::move(channel)),
      stub_(v1::TinyServe::NewStub(channel_)),
      metrics_(std::move(metrics)) {
  if (options.responses_store_mb > 0) {
    responses_ = std::make_unique<openai::ResponseStore>(
        static_cast<size_t>(options.responses_store_mb) << 20);
  }
  if (registry != nullptr) {
    requests_ = &prometheus::BuildCounter()
                     .Name("tinyserve_http_requests_total")
                     .Help("OpenAI-compatible HTTP API requests by route and HTTP status code")
                     .Register(*registry);
  }
  std::random_device rd;
  id_prefix_ = absl::StrFormat("%08x", rd());
}

absl::StatusOr<std::unique_ptr<HttpFrontend>> HttpFrontend::Start(
    const HttpFrontendOptions& options, std::shared_ptr<grpc::Channel> channel,
    prometheus::Registry* registry, std::shared_ptr<prometheus::Collectable> metrics) {
  if (!options.tool_call_parser.empty() && options.tool_call_parser != "hermes" &&
      options.tool_call_parser != "llama3_json")
    return absl::InvalidArgumentError(absl::StrCat(
        "--tool-call-parser: '", options.tool_call_parser,
        "' is not a parser TinyServe has (hermes, llama3_json; leave it unset to refuse "
        "\"auto\")"));
  if (!options.reasoning_parser.empty() && options.reasoning_parser != "qwen3" &&
      options.reasoning_parser != "deepseek_r1")
    return absl::InvalidArgumentError(absl::StrCat("--reasoning-parser: '",
                                                   options.reasoning_parser,
                                                   "' is not a parser TinyServe has (qwen3, "
                                                   "deepseek_r1)"));
  if (options.responses_store_mb < 0 || options.responses_store_mb > (1 << 20))
    return absl::InvalidArgumentError(absl::StrCat(
        "--responses-store-mb: ", options.responses_store_mb, " is not in [0, 1048576]"));
  std::unique_ptr<HttpFrontend> f(
      new HttpFrontend(options, std::move(channel), registry, std::move(metrics)));
  mg_init_library(0);
  // With HTTPS, civetweb serves plaintext on a loopback port and the terminator the public one.
  const bool https = !options.tls_cert.empty() || !options.tls_key.empty();
  const std::string listen =
      https ? std::string("127.0.0.1:0") : absl::StrCat(options.host, ":", options.port);
  const std::string threads = std::to_string(options.threads);
  const char* mg_options[] = {"listening_ports", listen.c_str(), "num_threads", threads.c_str(),
                              "enable_keep_alive", "yes",
                              // for the headers, each body read and each write: a client
                              // that stalls holds a thread at most this long
                              "request_timeout_ms", "10000", nullptr};
  mg_callbacks callbacks{};
  static thread_local std::string last_error;
  last_error.clear();
  callbacks.log_message = [](const mg_connection*, const char* message) {
    last_error = message;
    TS_LOG(WARNING) << "http: " << message;
    return 1;
  };
  f->ctx_ = mg_start(&callbacks, f.get(), mg_options);
  if (f->ctx_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve HTTP on ", listen, last_error.empty() ? "" : ": ", last_error));
  }
  mg_server_port ports[1];
  if (mg_get_server_ports(f->ctx_, 1, ports) >= 1) f->port_ = ports[0].port;
  if (https) {
    TlsTerminatorOptions tls;
    tls.host = options.host;
    tls.port = options.port;
    tls.cert_file = options.tls_cert;
    tls.key_file = options.tls_key;
    tls.inner_port = f->port_;
    tls.max_connections = options.threads * 4;
    tls.reload_seconds = options.tls_reload_seconds;
    auto terminator = TlsTerminator::Start(tls);
    if (!terminator.ok()) return terminator.status();  // ~HttpFrontend stops civetweb
    f->tls_ = *std::move(terminator);
    f->port_ = f->tls_->port();
  }
  mg_set_request_handler(f->ctx_, "/", &HttpFrontend::Handle, f.get());
  TS_LOG(INFO)
      << "OpenAI-compatible " << (https ? "HTTPS" : "HTTP") << " API on " << options.host << ":"
      << f->port_
      << " (/v1/completions, /v1/chat/completions, /v1/responses, /v1/messages, /v1/embeddings,"
         " /v1/models)";
  return f;
}

absl::StatusOr<std::unique_ptr<HttpFrontend>> HttpFrontend::StartFor(
    grpc::Server* server, const HttpFrontendOptions& options, prometheus::Registry* registry,
    std::shared_ptr<prometheus::Collectable> metrics) {
  if (options.port == 0) return std::unique_ptr<HttpFrontend>();
  // Responses of any size come back (an embeddings call of 2048 inputs is over gRPC's 4 MiB).
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  return Start(options, server->InProcessChannel(args), registry, std::move(metrics));
}

HttpFrontend::~HttpFrontend() { Stop(); }

void HttpFrontend::Stop() {
  // Answers still being written (at a drain their gRPC calls have ended: the server shut down
  // first) get up to 2 s to finish: once stopping, civetweb drops every write, which would cut
  // a stream before its last events and its terminating chunk. Best effort: requests still
  // arriving (answered 503 at once) count too, and one that starts after the wait is cut.
  for (int i = 0; i < 200 && ctx_ != nullptr && active_.load() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  tls_.reset();  // closes the HTTPS connections before civetweb goes
  if (ctx_ == nullptr) return;
  mg_stop(ctx_);
  ctx_ = nullptr;
}

int HttpFrontend::Handle(mg_connection* conn, void* self) {
  // civetweb's threads have small fixed stacks; the request runs on a thread of the process's
  // default stack size (JSON, protobuf and gRPC code below is not written for 100 KB stacks).
  auto* frontend = static_cast<HttpFrontend*>(self);
  ++frontend->active_;
  int code = 0;
  std::thread t([&] { code = frontend->Route(conn); });
  t.join();
  --frontend->active_;
  return code;
}

void HttpFrontend::Count(const char* route, int code) {
  if (requests_ == nullptr) return;
  requests_->Add({{"route", route}, {"code", std::to_string(code)}}).Increment();
}

int HttpFrontend::Route(mg_connection* conn) {
  using Handler = int (HttpFrontend::*)(mg_connection*, const std::string&);
  struct RouteSpec {
    const char* path;
    const char* method;
    const char* label;  // of tinyserve_http_requests_total
    bool open;          // served without the API key
    Handler handler;
    bool prefix = false;  // path is a prefix: "/v1/responses/" serves "/v1/responses/{id}"
  };
  static constexpr RouteSpec kRoutes[] = {
      {"/v1/completions", "POST", "completions", false, &HttpFrontend::Completions},
      {"/v1/chat/completions", "POST", "chat_completions", false, &HttpFrontend::ChatCompletions},
      {"/v1/responses", "POST", "responses", false, &HttpFrontend::Responses},
      {"/v1/responses/", "GET", "responses_get", false, &HttpFrontend::GetResponse, true},
      {"/v1/responses/", "DELETE", "responses_delete", false, &HttpFrontend::DeleteResponse, true},
      {"/v1/messages", "POST", "messages", false, &HttpFrontend::Messages},
      {"/v1/messages/count_tokens", "POST", "count_tokens", false, &HttpFrontend::CountTokens},
      {"/v1/models", "GET", "models", false, &HttpFrontend::Models},
      {"/v1/embeddings", "POST", "embeddings", false, &HttpFrontend::Embeddings},
      {"/v1/load_lora_adapter", "POST", "load_lora_adapter", false, &HttpFrontend::LoadLoraAdapter},
      {"/v1/unload_lora_adapter", "POST", "unload_lora_adapter", false,
       &HttpFrontend::UnloadLoraAdapter},
      {"/tokenize", "POST", "tokenize", false, &HttpFrontend::Tokenize},
      {"/detokenize", "POST", "detokenize", false, &HttpFrontend::Detokenize},
      {"/health", "GET", "health", true, &HttpFrontend::Health},
      {"/version", "GET", "version", true, &HttpFrontend::Version},
      {"/metrics", "GET", "metrics", true, &HttpFrontend::Metrics},
  };
  const mg_request_info* ri = mg_get_request_info(conn);
  const std::string method = ri->request_method ? ri->request_method : "";
  std::string path = ri->local_uri ? ri->local_uri : "";
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const RouteSpec* route = nullptr;
  for (const RouteSpec& r : kRoutes) {
    const std::string_view p = r.path;
    const bool match =
        r.prefix ? path.size() > p.size() && path.compare(0, p.size(), p) == 0 : path == p;
    if (match && (route == nullptr || method == r.method)) route = &r;  // same method first
  }

  auto serve = [&]() -> int {
    if (route == nullptr) {
      return SendError(conn, 404, absl::StrCat("no route ", method, " ", path), "not_found_error");
    }
    if (method != route->method) {
      return SendError(conn, 405, absl::StrCat(path, " takes ", route->method),
                       "invalid_request_error");
    }
    if (!route->open && !options_.api_key.empty()) {
      // OpenAI's clients send "Authorization: Bearer KEY", Anthropic's "x-api-key: KEY".
      const char* auth = mg_get_header(conn, "Authorization");
      const char* key = mg_get_header(conn, "x-api-key");
      if ((auth == nullptr || !SameSecret(auth, "Bearer " + options_.api_key)) &&
          (key == nullptr || !SameSecret(key, options_.api_key))) {
        return SendError(conn, 401,
                         "a valid API key is required (Authorization: Bearer, or x-api-key)",
                         "authentication_error");
      }
    }
    if (mg_get_header(conn, "Transfer-Encoding") != nullptr &&
        mg_get_header(conn, "Content-Length") != nullptr) {
      // Ambiguous framing (a request-smuggling pattern): RFC 9112 6.1 lets a server refuse it,
      // and the connection cannot be trusted for another request.
      mg_disable_connection_keep_alive(conn);
      return SendError(conn, 400, "the request has both Content-Length and Transfer-Encoding",
                       "invalid_request_error");
    }
    std::string body;
    const std::string too_large =
        absl::StrCat("the body is over ", options_.max_body_bytes, " bytes");
    if (ri->content_length > options_.max_body_bytes) {
      return SendError(conn, 413, too_large, "invalid_request_error");
    }
    char buf[16384];
    const int64_t length = ri->content_length;  // -1: chunked
    while (length < 0 || static_cast<int64_t>(body.size()) < length) {
      const int want = static_cast<int>(
          length < 0 ? sizeof(buf)
                     : std::min<int64_t>(sizeof(buf), length - static_cast<int64_t>(body.size())));
      // civetweb returns less than asked only when the client stalled past request_timeout_ms
      // or closed: the request ends here rather than holding its thread for another read.
      const int n = mg_read(conn, buf, want);
      if (n > 0) body.append(buf, n);
      if (body.size() > static_cast<size_t>(options_.max_body_bytes)) {
        return SendError(conn, 413, too_large, "invalid_request_error");
      }
      if (length < 0 ? n <= 0 : n < want) break;
    }
    if (length >= 0 && static_cast<int64_t>(body.size()) < length) {
      mg_disable_connection_keep_alive(conn);  // not another 10 s waiting for the rest
      return SendError(conn, 408,
                       absl::StrCat("the body stopped after ", body.size(), " of its ", length,
                                    " bytes (Content-Length)"),
                       "invalid_request_error");
    }
    return (this->*route->handler)(conn, body);
  };
  const int code = serve();
  Count(route != nullptr ? route->label : "other", code);
  return code;
}

absl::StatusOr<openai::ServedModel> HttpFrontend::Model() {
  bool have_copy = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    have_copy = model_.has_value();
    // A copy younger than the TTL, or one being refreshed by another request, serves as is:
    // one request refreshes at a time, the others do not wait for it.
    if (have_copy && (NowSeconds() - model_fetched_ < kModelInfoTtlSeconds || refreshing_))
      return *model_;
    if (have_copy) refreshing_ = true;
  }
  grpc::ClientContext ctx;
  PrepareUnary(&ctx, options_.api_key);
  // With a copy to fall back on, a refresh waits briefly.
  if (have_copy) ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::ModelInfo info;
  grpc::Status s = ShuttingDown();
  if (CallScope scope(this, &ctx); scope) {
    s = stub_->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
  }
  if (!s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    refreshing_ = false;
    if (model_.has_value()) {  // keep serving with what was known; try again after the TTL
      model_fetched_ = NowSeconds();
      return *model_;
    }
    return ToAbslStatus(
        grpc::Status(s.error_code(), absl::StrCat("model info: ", s.error_message())));
  }
  openai::ServedModel m;
  m.name = info.name().empty() ? info.path() : info.name();
  m.max_context = info.max_context();
  for (const v1::LoraAdapterInfo& a : info.lora_adapters()) m.loras.push_back(a.name());
  m.tool_call_parser = options_.tool_call_parser;
  m.reasoning_parser = options_.reasoning_parser;
  std::lock_guard<std::mutex> lock(mu_);
  model_ = m;
  model_info_ = info;
  model_fetched_ = NowSeconds();
  refreshing_ = false;
  return m;
}

int HttpFrontend::Completions(mg_connection* conn, const std::string& body) {
  return Generate(conn, openai::Endpoint::kCompletions, body);
}

int HttpFrontend::ChatCompletions(mg_connection* conn, const std::string& body) {
  return Generate(conn, openai::Endpoint::kChat, body);
}

int HttpFrontend::Responses(mg_connection* conn, const std::string& body) {
  return Generate(conn, openai::Endpoint::kResponses, body);
}

namespace {

// The {id} of /v1/responses/{id}.
std::string ResponseIdOf(mg_connection* conn) {
  std::string path = mg_get_request_info(conn)->local_uri;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path.substr(std::string_view("/v1/responses/").size());
}

// `words` random 32-bit words in hex: the unguessable part of a stored response's ids.
std::string RandomHex(int words) {
  std::random_device rd;
  std::string out;
  for (int i = 0; i < words; ++i) out += absl::StrFormat("%08x", rd());
  return out;
}

// An item's "id" ("" when it has none that is a string).
std::string ItemId(const json& item) {
  auto it = item.is_object() ? item.find("id") : item.end();
  return it != item.end() && it->is_string() ? it->get<std::string>() : "";
}

int ResponseNotFound(mg_connection* conn, const std::string& id) {
  return SendError(conn, 404,
                   absl::StrCat("no stored response '", id.substr(0, 100),
                                "' (never stored, deleted or evicted)"),
                   "invalid_request_error");
}

}  // namespace

int HttpFrontend::GetResponse(mg_connection* conn, const std::string&) {
  std::string id = ResponseIdOf(conn);
  if (const size_t slash = id.find('/'); slash != std::string::npos) {
    if (id.substr(slash) != "/input_items") {
      return SendError(conn, 404, "only /v1/responses/{id} and its /input_items are served",
                       "not_found_error");
    }
    id.resize(slash);
    return InputItems(conn, id);
  }
  std::optional<std::string> response = responses_ != nullptr ? responses_->Get(id) : std::nullopt;
  if (!response.has_value()) return ResponseNotFound(conn, id);
  return SendBody(conn, 200, *response);
}

// OpenAI's item list: the items that made the response (earlier turns' inputs and outputs, then
// its own input), newest first unless order=asc, `limit` (1..100, default 20) at a time after
// the item `after`.
int HttpFrontend::InputItems(mg_connection* conn, const std::string& id) {
  const char* query = mg_get_request_info(conn)->query_string;
  auto var = [&](const char* name) {
    char buf[256];
    const int n =
        query == nullptr ? -1 : mg_get_var(query, std::strlen(query), name, buf, sizeof buf);
    return n < 0 ? std::optional<std::string>() : std::optional<std::string>(std::string(buf, n));
  };
  int limit = 20;
  if (auto l = var("limit");
      l.has_value() && (!absl::SimpleAtoi(*l, &limit) || limit < 1 || limit > 100))
    return SendError(conn, 400, "limit: must be an integer in [1, 100]", "invalid_request_error");
  const std::string order = var("order").value_or("desc");
  if (order != "asc" && order != "desc")
    return SendError(conn, 400, "order: must be asc or desc", "invalid_request_error");
  absl::StatusOr<json> items =
      responses_ != nullptr ? responses_->Conversation(id, false) : absl::NotFoundError("");
  if (!items.ok()) return ResponseNotFound(conn, id);
  if (order == "desc") std::reverse(items->begin(), items->end());
  size_t from = 0;
  if (auto after = var("after")) {
    while (from < items->size() && ItemId((*items)[from]) != *after) ++from;
    if (from == items->size())
      return SendError(conn, 400, "after: no such item in the list", "invalid_request_error");
    ++from;
  }
  json data = json::array();
  for (size_t i = from; i < items->size() && data.size() < static_cast<size_t>(limit); ++i)
    data.push_back((*items)[i]);
  const bool more = from + data.size() < items->size();
  json first = data.empty() ? json() : json(ItemId(data.front()));
  json last = data.empty() ? json() : json(ItemId(data.back()));
  return SendBody(conn, 200,
                  Dump({{"object", "list"},
                        {"data", std::move(data)},
                        {"first_id", std::move(first)},
                        {"last_id", std::move(last)},
                        {"has_more", more}}));
}

int HttpFrontend::DeleteResponse(mg_connection* conn, const std::string&) {
  const std::string id = ResponseIdOf(conn);
  if (responses_ == nullptr || !responses_->Delete(id)) return ResponseNotFound(conn, id);
  return SendBody(conn, 200, Dump({{"id", id}, {"object", "response"}, {"deleted", true}}));
}

int HttpFrontend::Messages(mg_connection* conn, const std::string& body) {
  return Generate(conn, openai::Endpoint::kMessages, body);
}

int HttpFrontend::Version(mg_connection* conn, const std::string&) {
  return SendBody(conn, 200, Dump({{"version", options_.version}}));
}

int HttpFrontend::Generate(mg_connection* conn, openai::Endpoint endpoint,
                           const std::string& body) {
  // Anthropic's route answers errors in Anthropic's shape.
  const bool anthropic = endpoint == openai::Endpoint::kMessages;
  auto fail = [&](const absl::Status& st) {
    return anthropic ? SendAnthropicError(conn, st) : SendError(conn, st);
  };
  auto model = Model();
  if (!model.ok()) return fail(model.status());
  const std::string request_id = absl::StrCat("http-", id_prefix_, "-", next_id_.fetch_add(1));
  absl::StatusOr<openai::ParsedRequest> parsed;
  switch (endpoint) {
    case openai::Endpoint::kResponses:
      parsed = openai::ParseResponsesRequest(body, *model, request_id, responses_.get());
      break;
    case openai::Endpoint::kMessages:
      parsed = openai::ParseMessagesRequest(body, *model, request_id);
      break;
    default:
      parsed = openai::ParseRequest(endpoint, body, *model, request_id);
  }
  if (!parsed.ok()) return fail(parsed.status());
  const std::string& call_id = parsed->calls.front().request_id();
  const int64_t created = static_cast<int64_t>(std::time(nullptr));
  std::unique_ptr<openai::AnswerBuilder> builder;
  openai::ResponsesBuilder* responses = nullptr;
  switch (endpoint) {
    case openai::Endpoint::kResponses: {
      // Not the request id (a client may choose that): a stored response is fetched by its id.
      // Its items' ids (msg_..., rs_...) have their own random bits.
      auto b = std::make_unique<openai::ResponsesBuilder>(*parsed, "resp_" + RandomHex(4), created,
                                                          RandomHex(4));
      responses = b.get();
      builder = std::move(b);
      break;
    }
    case openai::Endpoint::kMessages:
      builder = std::make_unique<openai::MessagesBuilder>(*parsed, "msg_" + call_id);
      break;
    default:
      builder = std::make_unique<openai::ResponseBuilder>(
          *parsed,
          absl::StrCat(endpoint == openai::Endpoint::kChat ? "chatcmpl-" : "cmpl-", call_id),
          created);
  }

  bool headers_sent = false, client_gone = false;
  std::optional<grpc::Status> failure;
  const char* traceparent = mg_get_header(conn, "traceparent");
  CallScope scope(this);
  if (!scope) return fail(ToAbslStatus(ShuttingDown()));
  CallGroup group(stub_.get(), parsed->calls, options_.api_key,
                  TraceContext::Parse(traceparent != nullptr ? traceparent : ""));
  scope.Done();  // the calls exist: a shutdown from now on cancels them
  // A client that hangs up is noticed by a failed write when streaming, and by a look at its
  // socket every kDisconnectPoll (an unstreamed answer, a queued or prefilling request writes
  // nothing): its calls are cancelled, so the worker aborts them and frees their KV pages, as
  // vLLM and TGI do.
  const int sock = ConnectionSocket(mg_get_request_info(conn));
  auto next_check = std::chrono::steady_clock::now() + kDisconnectPoll;
  CallGroup::Event e;
  for (CallGroup::Wait w; (w = group.Next(&e, kDisconnectPoll)) != CallGroup::Wait::kEnd;) {
    if (sock >= 0 && !client_gone && std::chrono::steady_clock::now() >= next_check) {
      next_check = std::chrono::steady_clock::now() + kDisconnectPoll;
      if (PeerClosed(sock)) {
        client_gone = true;
        group.Cancel();
      }
    }
    if (w == CallGroup::Wait::kTimeout) continue;
    std::string out;
    if (!e.done) {
      out = builder->OnResponse(e.index, e.response);
    } else if (!e.status.ok() && !failure.has_value()) {
      // One failed choice fails the request; the others are cancelled.
      failure = e.status;
      group.Cancel();
      if (headers_sent) out = builder->OnFailure(e.index, e.status);
    }
    if (!parsed->stream || client_gone || out.empty()) continue;
    if (!headers_sent) {
      mg_send_http_ok(conn, "text/event-stream", -1);
      headers_sent = true;
    }
    if (!SendChunk(conn, out)) {
      client_gone = true;  // the worker aborts the requests and frees their pages
      group.Cancel();
    }
  }
  if (client_gone) return 499;
  if (failure.has_value() && !headers_sent) {
    // The gRPC form keeps the field a worker's message names as "param".
    return anthropic ? SendAnthropicError(conn, ToAbslStatus(*failure)) : SendError(conn, *failure);
  }
  const std::string end = parsed->stream ? builder->StreamEnd() : builder->Body();
  if (responses != nullptr && parsed->responses["store"] == true) {
    // Kept before the client reads the answer, so that it can continue it at once.
    const openai::Json& response = responses->Final();
    if (response.is_object() && response["status"] != "failed") {
      const openai::Json& previous = parsed->responses["previous_response_id"];
      // Input items get ids of their own (GET .../input_items lists and pages by them).
      openai::Json input = parsed->responses_input;
      const std::string base = absl::StrCat("msg_", RandomHex(3), "_");
      for (size_t i = 0; i < input.size(); ++i) {
        if (input[i].is_object() && ItemId(input[i]).empty())
          input[i]["id"] = absl::StrCat(base, i);
      }
      responses_->Put(response["id"].get<std::string>(),
                      previous.is_string() ? previous.get<std::string>() : "", input, response);
    }
  }
  if (parsed->stream) {
    if (!headers_sent) mg_send_http_ok(conn, "text/event-stream", -1);
    SendChunk(conn, end);
    mg_send_chunk(conn, "", 0);
    return 200;
  }
  return SendBody(conn, 200, end);
}

int HttpFrontend::Models(mg_connection* conn, const std::string&) {
  auto model = Model();
  if (!model.ok()) return SendError(conn, model.status());
  v1::ModelInfo info;
  {
    std::lock_guard<std::mutex> lock(mu_);
    info = model_info_;
  }
  // vLLM's form: the base model, then each LoRA adapter with the base as its parent.
  json data = json::array();
  data.push_back({{"id", model->name},
                  {"object", "model"},
                  {"created", 0},
                  {"owned_by", "tinyserve"},
                  {"root", info.path()},
                  {"parent", nullptr},
                  {"max_model_len", model->max_context}});
  for (const v1::LoraAdapterInfo& a : info.lora_adapters())
    data.push_back({{"id", a.name()},
                    {"object", "model"},
                    {"created", 0},
                    {"owned_by", "tinyserve"},
                    {"root", a.path()},
                    {"parent", model->name},
                    {"max_model_len", model->max_context}});
  return SendBody(conn, 200, Dump({{"object", "list"}, {"data", std::move(data)}}));
}

int HttpFrontend::Embeddings(mg_connection* conn, const std::string& body) {
  auto model = Model();
  if (!model.ok()) return SendError(conn, model.status());
  bool base64 = false;
  auto req = openai::ParseEmbeddingsRequest(body, *model, &base64);
  if (!req.ok()) return SendError(conn, req.status());
  if (req->request_id().empty())
    req->set_request_id(absl::StrCat("embd-", id_prefix_, "-", next_id_.fetch_add(1)));
  // Asynchronous, so that a client that hangs up cancels the call (its inputs are aborted).
  grpc::ClientContext ctx;
  AttachApiKey(options_.api_key, &ctx);
  v1::EmbedResponse resp;
  std::mutex mu;
  std::condition_variable cv;
  std::optional<grpc::Status> status;
  {
    CallScope scope(this);
    if (!scope) return SendError(conn, ShuttingDown());
    stub_->async()->Embed(&ctx, &*req, &resp, [&](grpc::Status s) {
      std::lock_guard<std::mutex> lock(mu);
      status = std::move(s);
      cv.notify_all();
    });
  }
  const int sock = ConnectionSocket(mg_get_request_info(conn));
  {
    std::unique_lock<std::mutex> lock(mu);
    while (!cv.wait_for(lock, kDisconnectPoll, [&] { return status.has_value(); })) {
      if (sock >= 0 && PeerClosed(sock)) ctx.TryCancel();
    }
  }
  if (!status->ok()) {
    // The gRPC field "inputs[i].token_ids.ids[j]" is the JSON field "input[i][j]".
    std::string message = status->error_message();
    if (status->error_code() != grpc::StatusCode::INVALID_ARGUMENT ||
        message.rfind("inputs", 0) != 0)
      return SendError(conn, *status);
    message.erase(5, 1);
    if (size_t at = message.find(".token_ids.ids"); at != std::string::npos) message.erase(at, 14);
    const std::string param = message.substr(0, message.find_first_of(": "));
    return SendError(conn, grpc::Status(status->error_code(), message), param);
  }
  const std::string name = req->lora_adapter().empty() ? model->name : req->lora_adapter();
  return SendBody(conn, 200, Dump(openai::EmbeddingsResponse(resp, name, base64)));
}

// vLLM's runtime LoRA routes: {"lora_name", "lora_path"} / {"lora_name"}; plain-text success.
int HttpFrontend::LoadLoraAdapter(mg_connection* conn, const std::string& body) {
  return LoraAdapterCall(conn, body, /*load=*/true);
}

int HttpFrontend::UnloadLoraAdapter(mg_connection* conn, const std::string& body) {
  return LoraAdapterCall(conn, body, /*load=*/false);
}

int HttpFrontend::LoraAdapterCall(mg_connection* conn, const std::string& body, bool load) {
  auto j = openai::ParseBody(body);
  if (!j.ok()) return SendError(conn, j.status());
  std::string fields[2];
  const char* keys[2] = {"lora_name", "lora_path"};
  for (int i = 0; i < (load ? 2 : 1); ++i) {
    auto it = j->find(keys[i]);
    if (it == j->end() || !it->is_string() || it->get<std::string>().empty()) {
      return SendError(conn,
                       grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                    absl::StrCat(keys[i], ": must be a non-empty string")),
                       keys[i]);
    }
    fields[i] = it->get<std::string>();
  }
  grpc::ClientContext ctx;
  AttachApiKey(options_.api_key, &ctx);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(150));
  grpc::Status s = ShuttingDown();
  if (CallScope scope(this, &ctx); scope && load) {
    v1::LoadLoraAdapterRequest req;
    req.set_lora_name(fields[0]);
    req.set_lora_path(fields[1]);
    v1::LoraAdapterInfo info;
    s = stub_->LoadLoraAdapter(&ctx, req, &info);
  } else if (scope) {
    v1::UnloadLoraAdapterRequest req;
    req.set_lora_name(fields[0]);
    v1::UnloadLoraAdapterResponse resp;
    s = stub_->UnloadLoraAdapter(&ctx, req, &resp);
  }
  if (!s.ok()) return SendError(conn, s);
  {
    std::lock_guard<std::mutex> lock(mu_);
    model_fetched_ = 0;  // /v1/models and "model" see the change from the next request on
  }
  return SendBody(conn, 200,
                  absl::StrCat("Success: LoRA adapter '", fields[0], "' ",
                               load ? "added" : "removed", " successfully."),
                  "text/plain; charset=utf-8");
}

int HttpFrontend::Tokenize(mg_connection* conn, const std::string& body) {
  auto j = openai::ParseBody(body);
  if (!j.ok()) return SendError(conn, j.status());
  v1::TokenizeRequest req;
  if (j->contains("messages")) {
    // vLLM's chat form: the prompt a chat completion with these fields would have (messages,
    // tools, add_generation_prompt, continue_final_message), parsed as that route parses them.
    auto model = Model();
    if (!model.ok()) return SendError(conn, model.status());
    auto chat = openai::ParseRequestJson(openai::Endpoint::kChat, *j, *model, "tokenize");
    if (!chat.ok()) return SendError(conn, chat.status());
    *req.mutable_chat() = chat->calls.front().chat();
  } else {
    auto prompt = j->find("prompt");
    if (prompt == j->end() || !prompt->is_string()) {
      return SendError(conn,
                       grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                    "prompt: must be a string (or give chat \"messages\")"),
                       "prompt");
    }
    req.set_text(prompt->get<std::string>());
    req.set_parse_special_tokens(true);  // as the completions route tokenizes
    if (auto add = j->find("add_special_tokens"); add != j->end() && add->is_boolean()) {
      req.set_add_special_tokens(add->get<bool>());
    }
  }
  v1::TokenizeResponse resp;
  if (grpc::Status s = TokenizeCall(req, &resp); !s.ok()) return SendError(conn, s);
  auto model = Model();
  json out = {
      {"tokens", json(std::vector<int32_t>(resp.token_ids().begin(), resp.token_ids().end()))},
      {"count", resp.token_ids_size()},
      {"max_model_len", model.ok() ? model->max_context : 0}};
  return SendBody(conn, 200, Dump(out));
}

grpc::Status HttpFrontend::TokenizeCall(const v1::TokenizeRequest& req,
                                        v1::TokenizeResponse* resp) {
  grpc::ClientContext ctx;
  PrepareUnary(&ctx, options_.api_key);
  CallScope scope(this, &ctx);
  return scope ? stub_->Tokenize(&ctx, req, resp) : ShuttingDown();
}

int HttpFrontend::CountTokens(mg_connection* conn, const std::string& body) {
  // Anthropic's /v1/messages/count_tokens: the input tokens a /v1/messages call with this body
  // would have (no max_tokens needed).
  auto model = Model();
  if (!model.ok()) return SendAnthropicError(conn, model.status());
  auto parsed = openai::ParseMessagesRequest(body, *model, "count_tokens", /*count_only=*/true);
  if (!parsed.ok()) return SendAnthropicError(conn, parsed.status());
  v1::TokenizeRequest req;
  *req.mutable_chat() = parsed->calls.front().chat();
  v1::TokenizeResponse resp;
  if (grpc::Status s = TokenizeCall(req, &resp); !s.ok()) {
    return SendAnthropicError(conn, ToAbslStatus(s));
  }
  return SendBody(conn, 200, Dump({{"input_tokens", resp.token_ids_size()}}));
}

int HttpFrontend::Detokenize(mg_connection* conn, const std::string& body) {
  auto j = openai::ParseBody(body);
  if (!j.ok()) return SendError(conn, j.status());
  auto tokens = j->find("tokens");
  v1::DetokenizeRequest req;
  bool ok = tokens != j->end() && tokens->is_array();
  if (ok) {
    for (const json& t : *tokens) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX) {
        ok = false;
        break;
      }
      req.add_token_ids(static_cast<int32_t>(t.get<int64_t>()));
    }
  }
  if (!ok) {
    return SendError(
        conn,
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "tokens: must be a list of token ids"),
        "tokens");
  }
  grpc::ClientContext ctx;
  PrepareUnary(&ctx, options_.api_key);
  v1::DetokenizeResponse resp;
  grpc::Status s = ShuttingDown();
  if (CallScope scope(this, &ctx); scope) s = stub_->Detokenize(&ctx, req, &resp);
  if (!s.ok()) return SendError(conn, s);
  return SendBody(conn, 200, Dump({{"prompt", resp.text()}}));
}

int HttpFrontend::Metrics(mg_connection* conn, const std::string&) {
  if (metrics_ == nullptr) return SendError(conn, 404, "no metrics here", "not_found_error");
  const std::string text = prometheus::TextSerializer().Serialize(metrics_->Collect());
  return SendBody(conn, 200, text, "text/plain; version=0.0.4; charset=utf-8");
}

int HttpFrontend::Health(mg_connection* conn, const std::string&) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  AttachApiKey(options_.api_key, &ctx);
  v1::ServerInfo info;
  grpc::Status s = ShuttingDown();
  if (CallScope scope(this, &ctx); scope) {
    s = stub_->GetServerInfo(&ctx, v1::GetServerInfoRequest(), &info);
  }
  if (s.ok() && info.ready()) return SendBody(conn, 200, "{}");
  return SendError(conn, 503, s.ok() ? "not ready" : s.error_message(),
                   "service_unavailable_error");
}

}  // namespace tinyserve
