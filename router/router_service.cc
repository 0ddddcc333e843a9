#include "router/router_service.h"

#include <atomic>
#include <functional>
#include <mutex>

#include "common/timer.h"
#include "router/proxy_call.h"
#include "worker/server/rpc_security.h"

namespace tinyserve {
namespace {

namespace v1 = tinyserve::v1;
using Async = v1::TinyServe::StubInterface::async_interface;

// Forwards one unary call to a healthy worker, finishing `context`'s reactor from the
// client callback. `call` issues the async client call.
template <typename Req, typename Resp>
grpc::ServerUnaryReactor* Forward(
    RouterCore* core, grpc::CallbackServerContext* context, const Req* request, Resp* response,
    void (*call)(Async*, grpc::ClientContext*, const Req*, Resp*,
                 std::function<void(grpc::Status)>)) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
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
  call(worker->api().async(), &up->context, request, response,
       [reactor, up](grpc::Status s) {
         reactor->Finish(s);
         delete up;
       });
  return reactor;
}

}  // namespace

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

grpc::ServerUnaryReactor* RouterService::GetModelInfo(grpc::CallbackServerContext* context,
                                                      const v1::GetModelInfoRequest* request,
                                                      v1::ModelInfo* response) {
  return Forward<v1::GetModelInfoRequest, v1::ModelInfo>(
      core_, context, request, response,
      [](Async* a, grpc::ClientContext* c, const v1::GetModelInfoRequest* q, v1::ModelInfo* r,
         std::function<void(grpc::Status)> f) { a->GetModelInfo(c, q, r, std::move(f)); });
}

grpc::ServerUnaryReactor* RouterService::Abort(grpc::CallbackServerContext* context,
                                               const v1::AbortRequest* request,
                                               v1::AbortResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
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
    grpc::ServerUnaryReactor* reactor;
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
    w->api().async()->Abort(&one->context, request, &one->response,
                            [fan, one](grpc::Status s) {
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
