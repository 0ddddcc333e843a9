// File: worker/server/worker_service.h
// The worker's gRPC services over one Engine:
//   - TinyServe (public API): Generate streams through a GenerateReactor fed by the engine's
//     RequestSink; Embed runs its inputs through an EmbedReactor; Abort, Tokenize, Detokenize,
//     GetModelInfo, GetServerInfo are unary and cheap.
//   - WorkerControl (router API): GetLoad, GetPrefixSummary, DeepHealth.
// Generate and Embed are raw methods (ByteBuffer) so malformed UTF-8 is answered with
// INVALID_ARGUMENT naming the field (worker/server/api_util.h).
//
// Threading: handlers run on gRPC callback threads and never block: they parse, validate,
// tokenize and hand the request to the engine (Engine::Submit is thread-safe). Engine sink
// callbacks run on the engine thread and only enqueue serialized messages. DeepHealth runs the
// probe forward on a helper thread. WorkerState flags are atomics set by WorkerServer.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "tinyserve/v1/tinyserve.grpc.pb.h"
#include "tinyserve/v1/worker.grpc.pb.h"
#include "worker/engine/engine.h"
#include "worker/server/prefix_lru.h"
#include "worker/server/worker_metrics.h"

namespace tinyserve {

class Tracer;

// State shared by the services and the server that owns them. Owned by WorkerServer.
struct WorkerState {
  Engine* engine = nullptr;
  WorkerMetrics* metrics = nullptr;
  std::string model_path;
  std::string model_identity;  // ModelIdentity(*engine): LoadReport.model
  std::string version;
  std::string api_key;          // non-empty: every call needs "authorization: Bearer <key>"
  bool allow_runtime_lora = false;  // LoadLoraAdapter / UnloadLoraAdapter served
  Tracer* tracer = nullptr;     // OpenTelemetry spans (tracing.h); null: off
  double start_time = 0;        // NowSeconds() at start
  std::atomic<bool> ready{false};
  std::atomic<bool> draining{false};
  PrefixLru prefixes{1 << 16};  // prompt block hashes served recently

  // Live request ids (a caller-chosen id may not be reused while its request runs). A call
  // that is not one engine request (Embed) gives how to cancel it, for Abort.
  bool AddLive(const std::string& id, std::function<void()> cancel = nullptr);
  void RemoveLive(const std::string& id);  // also drops its canceller
  bool IsLive(const std::string& id);
  std::string NewRequestId();
  // Runs the live call's canceller (outside the lock); false when there is none.
  bool Cancel(const std::string& id);

 private:
  std::mutex mu_;
  std::unordered_set<std::string> live_;  // GUARDED_BY(mu_)
  std::unordered_map<std::string, std::function<void()>> cancellers_;  // GUARDED_BY(mu_)
  std::atomic<uint64_t> next_id_{1};
};

// The model's identity as the router compares it (LoadReport.model): "<served name>#<16 hex
// digits>", the digits an FNV-1a hash of the architecture, shape and vocabulary (tokens, types,
// special ids), so workers agree exactly when they serve the same model under the same name.
std::string ModelIdentity(const Engine& engine);

class TinyServeService final : public tinyserve::v1::TinyServe::WithRawCallbackMethod_Generate<
                                   tinyserve::v1::TinyServe::WithRawCallbackMethod_Embed<
                                       tinyserve::v1::TinyServe::CallbackService>> {
 public:
  explicit TinyServeService(WorkerState* state) : state_(state) {}

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Embed(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* context,
                                  const tinyserve::v1::AbortRequest* request,
                                  tinyserve::v1::AbortResponse* response) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const tinyserve::v1::TokenizeRequest* request,
                                     tinyserve::v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context,
                                       const tinyserve::v1::DetokenizeRequest* request,
                                       tinyserve::v1::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const tinyserve::v1::GetModelInfoRequest* request,
                                         tinyserve::v1::ModelInfo* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const tinyserve::v1::GetServerInfoRequest* request,
                                          tinyserve::v1::ServerInfo* response) override;
  // Read the adapter and wait for the engine on a helper thread.
  grpc::ServerUnaryReactor* LoadLoraAdapter(grpc::CallbackServerContext* context,
                                            const tinyserve::v1::LoadLoraAdapterRequest* request,
                                            tinyserve::v1::LoraAdapterInfo* response) override;
  grpc::ServerUnaryReactor* UnloadLoraAdapter(
      grpc::CallbackServerContext* context, const tinyserve::v1::UnloadLoraAdapterRequest* request,
      tinyserve::v1::UnloadLoraAdapterResponse* response) override;

 private:
  WorkerState* state_;
};

class WorkerControlService final : public tinyserve::v1::WorkerControl::CallbackService {
 public:
  explicit WorkerControlService(WorkerState* state) : state_(state) {}

  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* context,
                                    const tinyserve::v1::GetLoadRequest* request,
                                    tinyserve::v1::LoadReport* response) override;
  grpc::ServerUnaryReactor* GetPrefixSummary(grpc::CallbackServerContext* context,
                                             const tinyserve::v1::GetPrefixSummaryRequest* request,
                                             tinyserve::v1::PrefixSummary* response) override;
  grpc::ServerUnaryReactor* DeepHealth(grpc::CallbackServerContext* context,
                                       const tinyserve::v1::DeepHealthRequest* request,
                                       tinyserve::v1::DeepHealthResponse* response) override;

 private:
  WorkerState* state_;
};

}  // namespace tinyserve
