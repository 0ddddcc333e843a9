#include "router/router_service.h"

#include <atomic>
#include <functional>
#include <mutex>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/timer.h"
#include "router/proxy_call.h"
#include "worker/server/api_util.h"
#include "worker/server/rpc_security.h"

namespace tinyserve {
namespace {

namespace v1 = tinyserve::v1;
using Async = v1::TinyServe::StubInterface::async_interface;

// A unary call passed on to workers: its client's cancel, or the server's shutdown, cancels the
// upstream calls (registered from before they start until their callback). Deletes itself in
// OnDone.
class UpstreamUnary final : public grpc::ServerUnaryReactor {
 public:
  void Add(grpc::ClientContext* upstream) {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) upstream->TryCancel();  // before the call exists: it starts cancelled
    upstream_.insert(upstream);
  }
  void Remove(grpc::ClientContext* upstream) {
    std::lock_guard<std::mutex> lock(mu_);
    upstream_.erase(upstream);
  }
  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    for (grpc::ClientContext* upstream : upstream_) upstream->TryCancel();
  }
  void OnDone() override { delete this; }

 private:
  std::mutex mu_;
  std::set<grpc::ClientContext*> upstream_;  // GUARDED_BY(mu_)
  bool cancelled_ = false;                   // GUARDED_BY(mu_)
};

// Forwards one unary call to a healthy worker, finishing the reactor from the client callback.
// `call` issues the async client call.
template <typename Req, typename Resp>
grpc::ServerUnaryReactor* Forward(
    RouterCore* core, grpc::CallbackServerContext* context, const Req* request, Resp* response,
    void (*call)(Async*, grpc::ClientContext*, const Req*, Resp*,
                 std::function<void(grpc::Status)>)) {
  auto* reactor = new UpstreamUnary;
  if (grpc::Status s = CheckApiKey(*context, core->api_key); !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  WorkerPtr worker = core->AnyHealthy();
  if (worker == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "no healthy worker"));
    return reactor;
  }
  struct Upstream {
    grpc::ClientContext context;
    WorkerPtr worker;
  };
  auto* up = new Upstream;
  up->worker = worker;
  if (context->deadline() != std::chrono::system_clock::time_point::max()) {
    up->context.set_deadline(context->deadline());
  }
  worker->Prepare(&up->context);
  reactor->Add(&up->context);
  call(worker->api().async(), &up->context, request, response, [reactor, up](grpc::Status s) {
    reactor->Remove(&up->context);
    reactor->Finish(s);  // OnDone may delete the reactor from now on
    delete up;
  });
  return reactor;
}

// One Embed call: it takes a router admission slot as a Generate does (or waits for one, or is
// refused when the queue is full), then goes to the least-loaded routable worker, and again to
// another one (up to max_attempts) when a worker is unavailable or its queue is full;
// embeddings have no side effects. A client that cancels leaves the queue or cancels the
// worker's call. Deletes itself in OnDone.
class EmbedForward final : public grpc::ServerUnaryReactor {
 public:
  EmbedForward(RouterCore* core, grpc::CallbackServerContext* context, grpc::ByteBuffer* out)
      : core_(core), deadline_(context->deadline()), out_(out), slot_(core->admission) {}

  v1::EmbedRequest* request() { return &request_; }

  void Admit() {
    const Admission::Result admitted = slot_.Acquire([this] { Admitted(); }, request_.priority());
    if (admitted == Admission::Result::kAdmitted) {
      Admitted();
    } else if (admitted == Admission::Result::kRejected) {
      core_->metrics->none()->outcomes[static_cast<int>(RouterOutcome::kRejected)]->Increment();
      End(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "router queue is full; retry later"));
    }
  }

  // Ends the call (releasing its admission slot): the last touch of `this`.
  void End(const grpc::Status& status) {
    slot_.Release();
    Finish(status);
  }

 private:
  void Admitted() {
    bool cancelled;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled = cancelled_;
    }
    if (cancelled) return End(GoneStatus());
    Attempt(grpc::Status::OK);
  }

  void Attempt(grpc::Status last) {
    WorkerPtr worker;
    for (const WorkerPtr& w : core_->Candidates(tried_, request_.lora_adapter()))
      if (worker == nullptr || w->inflight() < worker->inflight()) worker = w;
    if (worker == nullptr || static_cast<int>(tried_.size()) >= core_->max_attempts) {
      if (tried_.empty()) last = grpc::Status(grpc::StatusCode::UNAVAILABLE, "no healthy worker");
      return End(last);
    }
    if (!tried_.empty()) core_->metrics->retries().Increment();
    tried_.push_back(worker);
    grpc::ClientContext* context;
    {
      std::lock_guard<std::mutex> lock(mu_);
      context_ = std::make_unique<grpc::ClientContext>();
      context = context_.get();
      // (Cancelled already: the attempt starts cancelled and ends CANCELLED.)
      if (cancelled_) context->TryCancel();
    }
    if (deadline_ != std::chrono::system_clock::time_point::max()) context->set_deadline(deadline_);
    worker->Prepare(context);
    worker->AddInflight();
    response_.Clear();
    worker->api().async()->Embed(context, &request_, &response_, [this, worker](grpc::Status s) {
      worker->RemoveInflight();
      worker->series()->outcomes[static_cast<int>(OutcomeOf(s))]->Increment();
      // (A RESOURCE_EXHAUSTED of the client's own, a response over its size limit, would be
      // the same on any worker.)
      const bool again = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                         (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
                          s.error_message().find("larger than max") == std::string::npos);
      if (again) return Attempt(s);
      if (s.ok()) *out_ = ToByteBuffer(response_);
      End(s);
    });
  }

  grpc::Status GoneStatus() const {
    if (deadline_ <= std::chrono::system_clock::now())
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded");
    return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
  }

  void OnCancel() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
      if (context_) context_->TryCancel();
    }
    if (slot_.Cancel()) End(GoneStatus());
  }
  void OnDone() override { delete this; }

  RouterCore* core_;
  const std::chrono::system_clock::time_point deadline_;
  grpc::ByteBuffer* out_;
  v1::EmbedRequest request_;
  v1::EmbedResponse response_;
  std::mutex mu_;
  std::unique_ptr<grpc::ClientContext> context_;  // GUARDED_BY(mu_) the current attempt's
  bool cancelled_ = false;                        // GUARDED_BY(mu_)
  AdmissionTicket slot_;
  std::vector<WorkerPtr> tried_;
};

}  // namespace

grpc::ServerUnaryReactor* RouterService::Embed(grpc::CallbackServerContext* context,
                                               const grpc::ByteBuffer* request,
                                               grpc::ByteBuffer* response) {
  auto* call = new EmbedForward(core_, context, response);
  grpc::Status s = CheckApiKey(*context, core_->api_key);
  if (s.ok() && core_->draining.load())
    s = grpc::Status(grpc::StatusCode::UNAVAILABLE, "router is draining");
  if (s.ok()) s = ParseRequest(*request, call->request());
  if (!s.ok()) {
    if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT)
      core_->metrics->none()->outcomes[static_cast<int>(RouterOutcome::kInvalid)]->Increment();
    call->End(s);
    return call;
  }
  call->Admit();
  return call;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* RouterService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return new ProxyCall(core_, context, *request);
}

grpc::ServerUnaryReactor* RouterService::Tokenize(grpc::CallbackServerContext* context,
                                                  const v1::TokenizeRequest* request,
                                                  v1::TokenizeResponse* response) {
  return Forward<v1::TokenizeRequest, v1::TokenizeResponse>(
      core_, context, request, response,
      [](Async* a, grpc::ClientContext* c, const v1::TokenizeRequest* q,
         v1::TokenizeResponse* r, std::function<void(grpc::Status)> f) {
        a->Tokenize(c, q, r, std::move(f));
      });
}

grpc::ServerUnaryReactor* RouterService::Detokenize(grpc::CallbackServerContext* context,
                                                    const v1::DetokenizeRequest* request,
                                                    v1::DetokenizeResponse* response) {
  return Forward<v1::DetokenizeRequest, v1::DetokenizeResponse>(
      core_, context, request, response,
      [](Async* a, grpc::ClientContext* c, const v1::DetokenizeRequest* q,
         v1::DetokenizeResponse* r, std::function<void(grpc::Status)> f) {
        a->Detokenize(c, q, r, std::move(f));
      });
}

grpc::ServerUnaryReactor* RouterService::Abort(grpc::CallbackServerContext* context,
                                               const v1::AbortRequest* request,
                                               v1::AbortResponse* response) {
  auto* reactor = new UpstreamUnary;
  if (grpc::Status s = CheckApiKey(*context, core_->api_key); !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  std::vector<WorkerPtr> workers = core_->Candidates({});
  if (workers.empty()) {
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  // Fan out; the last reply finishes the call.
  struct FanOut {
    std::mutex mu;
    std::atomic<int> pending;
    v1::AbortResponse* response;
    UpstreamUnary* reactor;
  };
  auto* fan = new FanOut;
  fan->pending = static_cast<int>(workers.size());
  fan->response = response;
  fan->reactor = reactor;
  for (const WorkerPtr& w : workers) {
    struct One {
      grpc::ClientContext context;
      v1::AbortResponse response;
      WorkerPtr worker;
    };
    auto* one = new One;
    one->worker = w;
    one->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    w->Prepare(&one->context);
    fan->reactor->Add(&one->context);
    w->api().async()->Abort(&one->context, request, &one->response, [fan, one](grpc::Status s) {
      fan->reactor->Remove(&one->context);
      if (s.ok()) {
        std::lock_guard<std::mutex> lock(fan->mu);
        for (const auto& id : one->response.aborted()) {
          fan->response->add_aborted(id);
        }
      }
      delete one;
      if (--fan->pending == 0) {
        fan->reactor->Finish(grpc::Status::OK);
        delete fan;
      }
    });
  }
  return reactor;
}

namespace {

// How a call sent to every worker ends.
template <typename Resp>
struct FanOutRules {
  // Also a success when another worker succeeded (a load some workers already have, an unload
  // some already did).
  grpc::StatusCode tolerated = grpc::StatusCode::OK;
  // OK when any worker succeeded, whatever the others said (a read such as GetModelInfo).
  bool any_ok = false;
  // Folds a later worker's answer into the first one's (null: the first answer stands).
  void (*merge)(Resp* into, const Resp& from) = nullptr;
  // Each healthy worker's deadline (within the client's).
  int timeout_seconds = 120;
  // Also the workers not healthy now (starting, restarting, unreachable): a change reaches one
  // that is merely not yet marked healthy at once, and one that is down catches up later
  // (lora_sync.h), so their failures count only when no worker succeeded; their deadline is
  // a few seconds, so that a hung one does not hold the call up.
  bool unhealthy_too = false;
};

// Sends one call to every healthy worker (and the others with unhealthy_too) and finishes with
// the first failure (naming the worker), else OK. `call` issues the async call to one worker.
template <typename Req, typename Resp>
grpc::ServerUnaryReactor* ToWorkers(RouterCore* core, grpc::CallbackServerContext* context,
                                    const Req* request, Resp* response, FanOutRules<Resp> rules,
                                    void (*call)(Async*, grpc::ClientContext*, const Req*, Resp*,
                                                 std::function<void(grpc::Status)>)) {
  auto* reactor = new UpstreamUnary;
  if (grpc::Status s = CheckApiKey(*context, core->api_key); !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  std::vector<WorkerPtr> workers;
  bool any_healthy = false;
  for (const WorkerPtr& w : core->registry->Snapshot()) {
    any_healthy = any_healthy || w->healthy();
    if (w->healthy() || rules.unhealthy_too) workers.push_back(w);
  }
  if (!any_healthy) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "no healthy worker"));
    return reactor;
  }
  struct FanOut {
    std::mutex mu;
    int pending = 0, ok = 0;
    std::optional<grpc::Status> failure, tolerated, unhealthy_failure;  // GUARDED_BY(mu)
    Resp* response;
    FanOutRules<Resp> rules;
    UpstreamUnary* reactor;
  };
  auto* fan = new FanOut;
  fan->pending = static_cast<int>(workers.size());
  fan->response = response;
  fan->rules = std::move(rules);
  fan->reactor = reactor;
  const auto now = std::chrono::system_clock::now();
  for (const WorkerPtr& w : workers) {
    struct One {
      grpc::ClientContext context;
      Resp response;
      WorkerPtr worker;
      bool healthy;
    };
    auto* one = new One;
    one->worker = w;
    one->healthy = w->healthy();
    one->context.set_deadline(
        std::min(context->deadline(),
                 now + std::chrono::seconds(one->healthy ? fan->rules.timeout_seconds : 3)));
    w->Prepare(&one->context);
    fan->reactor->Add(&one->context);
    call(w->api().async(), &one->context, request, &one->response, [fan, one](grpc::Status s) {
      fan->reactor->Remove(&one->context);  // while this call still holds the reactor up
      bool last;
      {
        std::lock_guard<std::mutex> lock(fan->mu);
        const grpc::Status named(s.error_code(), absl::StrCat("worker ", one->worker->address(),
                                                              ": ", s.error_message()));
        if (s.ok()) {
          if (fan->ok++ == 0) {
            *fan->response = one->response;
          } else if (fan->rules.merge != nullptr) {
            fan->rules.merge(fan->response, one->response);
          }
        } else if (s.error_code() == fan->rules.tolerated) {
          if (!fan->tolerated) fan->tolerated = named;
        } else if (!one->healthy) {
          if (!fan->unhealthy_failure) fan->unhealthy_failure = named;
        } else if (!fan->failure) {
          fan->failure = named;
        }
        last = --fan->pending == 0;
      }
      delete one;
      if (!last) return;
      grpc::Status result = grpc::Status::OK;
      if (fan->failure && !(fan->rules.any_ok && fan->ok > 0)) {
        result = *fan->failure;
      } else if (fan->ok == 0 && fan->tolerated) {
        result = *fan->tolerated;
      } else if (fan->ok == 0 && fan->unhealthy_failure) {
        result = *fan->unhealthy_failure;
      }
      fan->reactor->Finish(result);
      delete fan;
    });
  }
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* RouterService::LoadLoraAdapter(grpc::CallbackServerContext* context,
                                                         const v1::LoadLoraAdapterRequest* request,
                                                         v1::LoraAdapterInfo* response) {
  FanOutRules<v1::LoraAdapterInfo> rules;
  rules.tolerated = grpc::StatusCode::ALREADY_EXISTS;
  rules.unhealthy_too = true;
  return ToWorkers<v1::LoadLoraAdapterRequest, v1::LoraAdapterInfo>(
      core_, context, request, response, std::move(rules),
      [](Async* a, grpc::ClientContext* c, const v1::LoadLoraAdapterRequest* q,
         v1::LoraAdapterInfo* r,
         std::function<void(grpc::Status)> f) { a->LoadLoraAdapter(c, q, r, std::move(f)); });
}

grpc::ServerUnaryReactor* RouterService::UnloadLoraAdapter(
    grpc::CallbackServerContext* context, const v1::UnloadLoraAdapterRequest* request,
    v1::UnloadLoraAdapterResponse* response) {
  FanOutRules<v1::UnloadLoraAdapterResponse> rules;
  rules.tolerated = grpc::StatusCode::NOT_FOUND;
  rules.unhealthy_too = true;
  return ToWorkers<v1::UnloadLoraAdapterRequest, v1::UnloadLoraAdapterResponse>(
      core_, context, request, response, std::move(rules),
      [](Async* a, grpc::ClientContext* c, const v1::UnloadLoraAdapterRequest* q,
         v1::UnloadLoraAdapterResponse* r,
         std::function<void(grpc::Status)> f) { a->UnloadLoraAdapter(c, q, r, std::move(f)); });
}

grpc::ServerUnaryReactor* RouterService::GetModelInfo(grpc::CallbackServerContext* context,
                                                      const v1::GetModelInfoRequest* request,
                                                      v1::ModelInfo* response) {
  // From every healthy worker: the adapters are those any of them serves (requests naming one
  // go to a worker that has it).
  FanOutRules<v1::ModelInfo> rules;
  rules.any_ok = true;
  rules.timeout_seconds = 5;  // a read: one slow worker must not hold up /v1/models
  rules.merge = [](v1::ModelInfo* into, const v1::ModelInfo& from) {
    for (const v1::LoraAdapterInfo& a : from.lora_adapters()) {
      bool known = false;
      for (const v1::LoraAdapterInfo& b : into->lora_adapters())
        known = known || b.name() == a.name();
      if (!known) *into->add_lora_adapters() = a;
    }
  };
  return ToWorkers<v1::GetModelInfoRequest, v1::ModelInfo>(
      core_, context, request, response, std::move(rules),
      [](Async* a, grpc::ClientContext* c, const v1::GetModelInfoRequest* q, v1::ModelInfo* r,
         std::function<void(grpc::Status)> f) { a->GetModelInfo(c, q, r, std::move(f)); });
}

grpc::ServerUnaryReactor* RouterService::GetServerInfo(grpc::CallbackServerContext* context,
                                                       const v1::GetServerInfoRequest*,
                                                       v1::ServerInfo* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status s = CheckApiKey(*context, core_->api_key); !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  response->set_role("router");
  response->set_version(core_->version);
  response->set_running(core_->admission->inflight());
  response->set_waiting(core_->admission->waiting());
  response->set_uptime_seconds(NowSeconds() - core_->start_time);
  response->set_draining(core_->draining.load());
  int healthy = 0;
  for (const WorkerPtr& w : core_->registry->Snapshot()) {
    const v1::LoadReport load = w->load();
    v1::WorkerStatus* s = response->add_workers();
    s->set_address(w->address());
    s->set_healthy(w->healthy());
    s->set_circuit_open(w->breaker().open());
    s->set_inflight(w->inflight());
    s->set_running(load.running());
    s->set_waiting(load.waiting());
    s->set_kv_pages_used(load.kv_pages_used());
    s->set_kv_pages_total(load.kv_pages_total());
    s->set_model(load.model());
    s->set_model_mismatch(w->model_mismatch());
    if (w->healthy()) {
      ++healthy;
      response->set_kv_pages_total(response->kv_pages_total() + load.kv_pages_total());
      response->set_kv_pages_used(response->kv_pages_used() + load.kv_pages_used());
      response->set_kv_pages_free(response->kv_pages_free() + load.kv_pages_free());
    }
  }
  response->set_ready(healthy > 0 && !core_->draining.load());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tinyserve
