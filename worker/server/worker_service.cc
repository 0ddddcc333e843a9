#include "worker/server/worker_service.h"

#include <unistd.h>

#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/fnv.h"
#include "common/log.h"
#include "common/timer.h"
#include "worker/server/api_util.h"
#include "worker/server/block_hash.h"
#include "worker/server/embed_reactor.h"
#include "worker/server/generate_reactor.h"
#include "worker/server/proto_convert.h"
#include "worker/server/rpc_security.h"
#include "worker/server/status_convert.h"

namespace tinyserve {
namespace {

namespace v1 = tinyserve::v1;

grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context,
                                    const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

}  // namespace

std::string ModelIdentity(const Engine& engine) {
  Fnv1a digest;
  const ModelConfig& c = engine.model_config();
  const TokenizerData& t = engine.tokenizer().data();
  digest.Add(absl::StrCat(ArchName(c), " ", c.n_layers, " ", c.dim, " ", c.n_heads, " ",
                          c.n_kv_heads, " ", c.head_dim, " ", c.ffn_dim, " ", c.rope_theta, " ",
                          t.model, " ", t.bos_id, " ", t.eos_id, " ", t.tokens.size()));
  for (const std::string& token : t.tokens) digest.Add(token);
  for (TokenType type : t.types) digest.Add(std::string(1, static_cast<char>(type)));
  // (A proto string: a name from a GGUF or a path need not be UTF-8.)
  return absl::StrCat(SanitizeUtf8(engine.served_name()), "#",
                      absl::Hex(digest.value(), absl::kZeroPad16));
}

bool WorkerState::AddLive(const std::string& id, std::function<void()> cancel) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!live_.insert(id).second) return false;
  if (cancel) cancellers_[id] = std::move(cancel);
  return true;
}

void WorkerState::RemoveLive(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  live_.erase(id);
  cancellers_.erase(id);
}

bool WorkerState::IsLive(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  return live_.count(id) > 0;
}

bool WorkerState::Cancel(const std::string& id) {
  std::function<void()> cancel;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cancellers_.find(id);
    if (it == cancellers_.end()) return false;
    cancel = it->second;
  }
  cancel();
  return true;
}

std::string WorkerState::NewRequestId() {
  return absl::StrCat("w", getpid(), "-", next_id_.fetch_add(1));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* TinyServeService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return new GenerateReactor(state_, context, *request);
}

grpc::ServerUnaryReactor* TinyServeService::Embed(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* request,
                                                  grpc::ByteBuffer* response) {
  return new EmbedReactor(state_, context, *request, response);
}

grpc::ServerUnaryReactor* TinyServeService::Abort(grpc::CallbackServerContext* context,
                                                  const v1::AbortRequest* request,
                                                  v1::AbortResponse* response) {
  if (grpc::Status s = CheckApiKey(*context, state_->api_key); !s.ok()) {
    return FinishNow(context, s);
  }
  std::set<std::string> seen;
  for (const std::string& id : request->request_ids()) {
    if (!seen.insert(id).second) continue;  // each id once
    // Both: a call with a canceller (Embed) or an engine request. Only live ids are echoed.
    const bool live = state_->IsLive(id);
    state_->Cancel(id);
    state_->engine->Abort(id);
    if (live) response->add_aborted(id);
  }
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* TinyServeService::Tokenize(grpc::CallbackServerContext* context,
                                                     const v1::TokenizeRequest* request,
                                                     v1::TokenizeResponse* response) {
  if (grpc::Status s = CheckApiKey(*context, state_->api_key); !s.ok()) {
    return FinishNow(context, s);
  }
  const Tokenizer& tok = state_->engine->tokenizer();
  std::vector<int32_t> ids;
  if (request->chat().messages_size() > 0) {
    absl::StatusOr<std::vector<int32_t>> chat = EncodeChat(request->chat(), tok);
    if (!chat.ok()) return FinishNow(context, ToGrpcStatus(chat.status()));
    ids = *std::move(chat);
  } else {
    const bool add_bos = request->has_add_special_tokens() ? request->add_special_tokens() : true;
    ids = tok.Encode(request->text(), request->parse_special_tokens(), add_bos);
  }
  for (int32_t id : ids) {
    response->add_token_ids(id);
    response->add_tokens(SanitizeUtf8(tok.TokenBytes(id)));
  }
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* TinyServeService::Detokenize(grpc::CallbackServerContext* context,
                                                       const v1::DetokenizeRequest* request,
                                                       v1::DetokenizeResponse* response) {
  if (grpc::Status s = CheckApiKey(*context, state_->api_key); !s.ok()) {
    return FinishNow(context, s);
  }
  const Tokenizer& tok = state_->engine->tokenizer();
  std::vector<int32_t> ids(request->token_ids().begin(), request->token_ids().end());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= tok.vocab_size()) {
      return FinishNow(context, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                             absl::StrCat("token_ids[", i, "] = ", ids[i],
                                                          " is outside the vocabulary [0, ",
                                                          tok.vocab_size(), ")")));
    }
  }
  response->set_text(SanitizeUtf8(tok.Decode(ids)));
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* TinyServeService::GetModelInfo(grpc::CallbackServerContext* context,
                                                         const v1::GetModelInfoRequest*,
                                                         v1::ModelInfo* response) {
  if (grpc::Status s = CheckApiKey(*context, state_->api_key); !s.ok()) {
    return FinishNow(context, s);
  }
  const Engine& engine = *state_->engine;
  const ModelConfig& c = engine.model_config();
  response->set_name(SanitizeUtf8(engine.served_name()));
  response->set_path(SanitizeUtf8(state_->model_path));
  response->set_arch(ArchName(c));
  response->set_vocab_size(engine.tokenizer().vocab_size());
  response->set_max_context(engine.max_context());
  response->set_page_size(engine.options().page_size);
  response->set_n_layers(c.n_layers);
  response->set_n_heads(c.n_heads);
  response->set_n_kv_heads(c.n_kv_heads);
  response->set_head_dim(c.head_dim);
  response->set_hidden_size(c.dim);
  response->set_bos_id(engine.tokenizer().bos_id());
  response->set_eos_id(engine.tokenizer().eos_id());
  response->set_default_policy(engine.options().default_selection.policy);
  response->set_tp_size(engine.options().tp_size);
  for (const LoraInfo& l : engine.loras()) {
    if (l.name.empty()) continue;  // unloaded
    v1::LoraAdapterInfo* a = response->add_lora_adapters();
    a->set_name(l.name);
    a->set_path(SanitizeUtf8(l.path));
    a->set_rank(l.max_rank);
    a->set_alpha(l.alpha);
    a->set_tensors(l.tensors);
  }
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* TinyServeService::GetServerInfo(grpc::CallbackServerContext* context,
                                                          const v1::GetServerInfoRequest*,
                                                          v1::ServerInfo* response) {
  if (grpc::Status s = CheckApiKey(*context, state_->api_key); !s.ok()) {
    return FinishNow(context, s);
  }
  const EngineStats s = state_->engine->Stats();
  response->set_role("worker");
  response->set_version(state_->version);
  response->set_running(s.running);
  response->set_waiting(s.waiting);
  response->set_kv_pages_total(s.kv_pages_total);
  response->set_kv_pages_used(s.kv_pages_used);
  response->set_kv_pages_free(s.kv_pages_free);
  response->set_uptime_seconds(NowSeconds() - state_->start_time);
  response->set_draining(state_->draining.load());
  response->set_ready(state_->ready.load());
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* TinyServeService::LoadLoraAdapter(
    grpc::CallbackServerContext* context, const v1::LoadLoraAdapterRequest* request,
    v1::LoraAdapterInfo* response) {
  if (grpc::Status s = CheckApiKey(*context, state_->api_key); !s.ok()) {
    return FinishNow(context, s);
  }
  if (!state_->allow_runtime_lora) {
    return FinishNow(context, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                           "loading LoRA adapters at run time is off (start the "
                                           "worker with --allow-runtime-lora)"));
  }
  const double at = request->loaded_at();
  if (!(at >= 0 && at <= UnixSeconds() + 60)) {  // (NaN fails too)
    return FinishNow(context, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                           "loaded_at: must be 0 or a Unix time not in the "
                                           "future"));
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Reading the adapter takes file I/O and a wait for the engine: off the callback thread.
  std::thread([state = state_, reactor, request, response] {
    absl::StatusOr<int> id =
        state->engine->LoadLora(request->lora_name(), request->lora_path(), request->loaded_at());
    if (!id.ok()) return reactor->Finish(ToGrpcStatus(id.status()));
    const LoraInfo l = state->engine->loras()[*id - 1];
    if (state->metrics != nullptr) state->metrics->AddLora(*id, request->lora_name());
    TS_LOG(INFO) << "loaded LoRA adapter '" << request->lora_name() << "' from "
                 << request->lora_path() << " (id " << *id << ")";
    response->set_name(request->lora_name());
    response->set_path(SanitizeUtf8(l.path));
    response->set_rank(l.max_rank);
    response->set_alpha(l.alpha);
    response->set_tensors(l.tensors);
    reactor->Finish(grpc::Status::OK);
  }).detach();
  return reactor;
}

grpc::ServerUnaryReactor* TinyServeService::UnloadLoraAdapter(
    grpc::CallbackServerContext* context, const v1::UnloadLoraAdapterRequest* request,
    v1::UnloadLoraAdapterResponse*) {
  if (grpc::Status s = CheckApiKey(*context, state_->api_key); !s.ok()) {
    return FinishNow(context, s);
  }
  if (!state_->allow_runtime_lora) {
    return FinishNow(context, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                           "unloading LoRA adapters at run time is off (start "
                                           "the worker with --allow-runtime-lora)"));
  }
  const absl::Status s = state_->engine->UnloadLora(request->lora_name());
  if (s.ok()) {
    if (state_->metrics != nullptr) state_->metrics->RemoveLora(request->lora_name());
    TS_LOG(INFO) << "unloaded LoRA adapter '" << request->lora_name() << "'";
  }
  return FinishNow(context, ToGrpcStatus(s));
}

grpc::ServerUnaryReactor* WorkerControlService::GetLoad(grpc::CallbackServerContext* context,
                                                        const v1::GetLoadRequest*,
                                                        v1::LoadReport* response) {
  if (grpc::Status s = CheckApiKey(*context, state_->api_key); !s.ok()) {
    return FinishNow(context, s);
  }
  const EngineStats s = state_->engine->Stats();
  const EngineOptions& o = state_->engine->options();
  response->set_running(s.running);
  response->set_waiting(s.waiting);
  response->set_kv_pages_used(s.kv_pages_used);
  response->set_kv_pages_free(s.kv_pages_free);
  response->set_kv_pages_total(s.kv_pages_total);
  response->set_kv_pages_cached(s.kv_pages_cached);
  response->set_prefix_queries_tokens(s.prefix_queries_tokens);
  response->set_prefix_hits_tokens(s.prefix_hits_tokens);
  response->set_prefix_queries_pages(s.prefix_queries_pages);
  response->set_prefix_hits_pages(s.prefix_hits_pages);
  response->set_max_batch(o.max_batch);
  response->set_max_queue(o.max_queue);
  response->set_draining(state_->draining.load());
  response->set_ready(state_->ready.load());
  response->set_steps_total(s.steps_total);
  response->set_model(state_->model_identity);
  for (const LoraInfo& lora : state_->engine->loras()) {
    if (lora.name.empty()) continue;  // unloaded
    response->add_lora_adapters(lora.name);
    if (!lora.runtime) continue;
    v1::RuntimeLoraAdapter* r = response->add_runtime_lora_adapters();
    r->set_name(lora.name);
    r->set_path(lora.path);
    r->set_loaded_at(lora.loaded_at);
  }
  for (const auto& [name, at] : state_->engine->unloaded_loras()) {
    v1::UnloadedLoraAdapter* u = response->add_unloaded_lora_adapters();
    u->set_name(name);
    u->set_unloaded_at(at);
  }
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* WorkerControlService::GetPrefixSummary(
    grpc::CallbackServerContext* context, const v1::GetPrefixSummaryRequest* request,
    v1::PrefixSummary* response) {
  if (grpc::Status s = CheckApiKey(*context, state_->api_key); !s.ok()) {
    return FinishNow(context, s);
  }
  response->set_text_block_bytes(kTextBlockBytes);
  response->set_token_block_size(kTokenBlockSize);
  const size_t max = request->max_hashes() > 0 ? static_cast<size_t>(request->max_hashes()) : 0;
  for (uint64_t h : state_->prefixes.Snapshot(max)) response->add_block_hashes(h);
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* WorkerControlService::DeepHealth(grpc::CallbackServerContext* context,
                                                           const v1::DeepHealthRequest*,
                                                           v1::DeepHealthResponse* response) {
  if (grpc::Status s = CheckApiKey(*context, state_->api_key); !s.ok()) {
    return FinishNow(context, s);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // The probe runs a forward: keep it off the callback thread.
  std::thread([state = state_, reactor, response] {
    Stopwatch watch;
    const absl::Status s = state->engine->HealthProbe();
    response->set_ok(s.ok());
    response->set_message(SanitizeUtf8(std::string(s.message())));
    response->set_seconds(watch.Seconds());
    reactor->Finish(grpc::Status::OK);
  }).detach();
  return reactor;
}

}  // namespace tinyserve
