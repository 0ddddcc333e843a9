// File: router/router_service.h
// The public TinyServe API as the router serves it: Generate is proxied (proxy_call.h);
// Tokenize and Detokenize are forwarded to a healthy worker (all workers serve the same
// model); Embed goes to the least-loaded worker, and to another when that one is unavailable or
// full; Load/UnloadLoraAdapter go to every worker (one not healthy gets a few seconds,
// and its failure counts only if no worker succeeded: lora_sync.h brings it in line later);
// GetModelInfo goes to every healthy worker (their adapter lists merged); Abort goes to
// every routable worker (the router does not track which worker holds which id; unknown ids are
// ignored there); GetServerInfo is answered here. A Generate or Embed naming a LoRA adapter goes
// to the workers that serve it (RouterCore::Candidates).
//
// Threading: handlers run on gRPC callback threads and never block (forwards use the async
// client API and finish from its callback).
#pragma once

#include "router/router_core.h"
#include "tinyserve/v1/tinyserve.grpc.pb.h"

namespace tinyserve {

class RouterService final : public tinyserve::v1::TinyServe::WithRawCallbackMethod_Generate<
                                tinyserve::v1::TinyServe::WithRawCallbackMethod_Embed<
                                    tinyserve::v1::TinyServe::CallbackService>> {
 public:
  explicit RouterService(RouterCore* core) : core_(core) {}

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  // To the least-loaded worker; retried on another when one is unavailable or full.
  grpc::ServerUnaryReactor* Embed(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;
  // To every worker; the first failure (naming the worker) is the call's.
  grpc::ServerUnaryReactor* LoadLoraAdapter(grpc::CallbackServerContext* context,
                                            const tinyserve::v1::LoadLoraAdapterRequest* request,
                                            tinyserve::v1::LoraAdapterInfo* response) override;
  grpc::ServerUnaryReactor* UnloadLoraAdapter(
      grpc::CallbackServerContext* context, const tinyserve::v1::UnloadLoraAdapterRequest* request,
      tinyserve::v1::UnloadLoraAdapterResponse* response) override;
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

 private:
  RouterCore* core_;
};

}  // namespace tinyserve
