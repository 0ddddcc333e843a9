// File: worker/engine/engine.h
// The engine: one model, one paged KV cache, one scheduler thread.
//
// Callers (the CLI, the gRPC worker service, tests) Submit() requests from any thread; the
// engine thread owns the batch and the KV cache and runs steps: admit waiting requests while
// free KV pages allow, prefill in chunks, decode every running sequence in one batched forward,
// sample, stream tokens to each request's sink. Cancellation (Abort, deadline) and preemption
// (recompute, when pages run out) take effect at the next step and return pages to the pool.
// Prefix caching shares full pages of identical page-aligned token prefixes across requests.
//
// Threading: Submit/Abort/Stats/Drain are thread-safe. Sink callbacks run on the engine thread
// and must not block (hand the data to the RPC's reactor and return).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/model/lora_adapter.h"
#include "worker/model/model_config.h"
#include "worker/sampling/grammar.h"
#include "worker/sampling/json_constraint.h"
#include "worker/sampling/sampling_params.h"
#include "worker/select/selection_spec.h"
#include "worker/tokenizer/tokenizer.h"

namespace tinyserve {

class Communicator;
class WeightSource;

struct EngineOptions {
  std::string model_path;
  // The name the APIs serve the model by (vLLM's --served-model-name): ModelInfo.name, the
  // OpenAI "model", the metrics' model label. Empty: the model's own name, else its path.
  std::string served_model_name;
  int threads = 1;
  int page_size = 16;
  int64_t kv_pages = 0;          // 0: sized from kv_memory_mb
  int64_t kv_memory_mb = 512;    // KV pool size when kv_pages == 0
  std::string kv_dtype = "f16";  // "f16" or "int8"
  // "cpu" or "cuda" (worker/runner/cuda_runner.h: Llama family, policies dense and quest).
  std::string device = "cpu";
  int cuda_device_pages = 0;     // cuda: tiered KV with this many device pages per layer (0: off)
  bool cuda_graphs = true;       // cuda: replay decode steps as CUDA graphs
  int max_context = 0;           // 0: the model's trained context
  // Replaces the model's RoPE scaling: a rope_scaling JSON object as config.json holds it
  // (vLLM's --rope-scaling), e.g. YaRN for Qwen2.5 / Qwen3 past 32K; empty: the model's.
  std::string rope_scaling;
  // Replaces the model's chat template (Jinja source; vLLM's --chat-template): it must be
  // within the Jinja subset (worker/tokenizer/jinja.h), else Create fails. Empty: the model's.
  std::string chat_template;
  int max_batch = 16;            // running sequences per step
  int max_step_tokens = 512;     // prefill chunk budget per step (chunked prefill)
  int max_queue = 256;           // waiting beyond free batch slots before RESOURCE_EXHAUSTED
  bool prefix_caching = true;
  SelectionSpec default_selection;  // the server's policy; requests may override
  // Speculative decoding by prompt lookup (worker/engine/ngram_draft.h): a decoding sequence
  // whose last n tokens (n from spec_ngram_max down to spec_ngram_min) occurred earlier drafts
  // up to spec_tokens of the tokens that followed; one forward verifies them all and every row
  // samples as a plain step would, so the output follows the same distribution (seeded: the
  // same draws). 0 turns it off. CPU runner, one rank; a sequence speculates while its policy
  // attends densely (Policy::DenseAt), since verified rows attend all their pages.
  int spec_tokens = 0;
  int spec_ngram_min = 2, spec_ngram_max = 4;
  // Rule expansions one GBNF grammar's vocabulary mask may take (about 2 s at the default,
  // worker/sampling/grammar.h); past it the request ends with RESOURCE_EXHAUSTED.
  int64_t grammar_mask_budget = Grammar::kMaxScan;
  int tp_rank = 0, tp_size = 1;     // tensor parallelism (see worker/tp)
  // Tensor parallelism (tp_size > 1): this engine is rank 0 of the group and tp_comm (not owned,
  // must outlive the engine) is its communicator; ranks > 0 run worker/tp/tp_follower.h, which
  // replays the steps this engine broadcasts. Idle engines send a heartbeat every
  // tp_heartbeat_seconds so a dead rank is noticed (Engine::TpStatus) without traffic.
  Communicator* tp_comm = nullptr;
  double tp_heartbeat_seconds = 1.0;
  // LoRA adapters (worker/model/lora_adapter.h) loaded at start and served side by side: a
  // request picks one by GenerateRequest::lora. CPU (tensor-parallel too) and CUDA runners.
  std::vector<LoraModule> loras;
};

// Each token's bytes and kind (end-of-generation, other special, normal) as the constrained
// decoders (JSON, schemas, regular expressions, grammars) read them.
std::shared_ptr<const TokenTable> MakeTokenTable(const Tokenizer& tok);
// The tokens whose bytes are exactly `text` (special tokens parsed), to force it: Encode's, or,
// where a SentencePiece vocabulary puts a space before it, those after a word; else Encode's.
std::vector<int32_t> ForcedTokens(const Tokenizer& tok, std::string_view text);

enum class FinishReason { kLength, kEos, kStopToken, kStopString, kAbort, kDeadline, kError };
const char* FinishReasonName(FinishReason r);

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;
};

struct GeneratedToken {
  int32_t id = 0;
  std::string text;  // the UTF-8 text this token completes (may be empty mid-character)
  float logprob = 0;               // set when logprobs >= 0
  std::vector<TokenLogprob> top;   // top-n alternatives when logprobs > 0
  int rank = 0;                    // prompt logprobs: 1 + the tokens more likely (0: none)
};

// Selection instrumentation of one request (worker/select/selection_stats.h has the details).
struct SelectionSummary {
  std::string policy;
  int64_t steps = 0;
  int64_t pages_scored = 0;
  int64_t pages_selected = 0;
  int64_t kv_bytes_read = 0;
  int64_t kv_bytes_dense = 0;
  double page_hit_rate = -1;    // -1 when no oracle sample was taken
  double mass_recall = -1;
  double reuse = -1;
  double select_seconds = 0;
  double attention_seconds = 0;
};

struct RequestUsage {
  int prompt_tokens = 0;
  int cached_tokens = 0;      // prompt tokens served from the prefix cache
  int generated_tokens = 0;
  int preemptions = 0;
  double queue_seconds = 0;   // arrival -> first scheduled
  double ttft_seconds = 0;    // arrival -> first token
  double prefill_seconds = 0; // first scheduled -> first token
  double decode_seconds = 0;  // first token -> last token
  double e2e_seconds = 0;
  int spec_draft_tokens = 0;     // speculative tokens drafted (EngineOptions::spec_tokens)
  int spec_accepted_tokens = 0;  // of which the model agreed with
  std::string stop_string;       // kStopString: the stop string that ended the output
  int32_t stop_token_id = -1;    // kStopToken: the stop token id that ended it
  SelectionSummary selection;
};

class RequestSink {
 public:
  virtual ~RequestSink() = default;
  // New tokens of this request (usually one per step).
  virtual void OnTokens(const std::vector<GeneratedToken>& tokens, const RequestUsage& usage) = 0;
  // Exactly once, last. status is OK unless reason is kError (then the error).
  virtual void OnFinish(FinishReason reason, const RequestUsage& usage, absl::Status status) = 0;
  // Embedding requests (GenerateRequest::pooling): once, the pooled vector [hidden size], then
  // OnFinish(kLength). No OnTokens.
  virtual void OnEmbedding(const std::vector<float>& /*values*/) {}
  // With sampling.prompt_logprobs >= 0, once, before the first OnTokens: one entry per prompt
  // token (the first, without context, has logprob 0, no alternatives and rank 0).
  virtual void OnPromptLogprobs(const std::vector<GeneratedToken>& /*tokens*/) {}
};

struct GenerateRequest {
  std::string request_id;
  bool internal = false;  // the server's own (health probes): not counted, not held by max_queue
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  std::optional<SelectionSpec> selection;  // nullopt: the server's default
  double deadline = 0;                     // monotonic NowSeconds(); 0 = none
  uint64_t cache_salt = 0;                 // seeds the prefix-cache hash chain; 0 = unsalted
  int priority = 0;                        // lower runs sooner (vLLM's); FIFO within a level
  // Output a failed worker already streamed (the router's migration): prefilled after the
  // prompt, replayed through stop strings and constraints without being sent again, and
  // counted in max_tokens; generation continues after it.
  std::vector<int32_t> continuation_ids;
  // 1 + the index of a LoRA adapter in EngineOptions::loras; 0: the base model. Its cached
  // prompt pages are shared only with requests of the same adapter.
  int lora = 0;
  // Not kNone: an embedding request. The prompt is prefilled and its hidden states after the
  // final norm are pooled (RequestSink::OnEmbedding); nothing is generated and sampling is
  // ignored. kMean computes every prompt token (no prefix-cache reuse). CPU and CUDA runners.
  Pooling pooling = Pooling::kNone;
  // A later part of a call accepted before a drain began (an Embed call's further inputs):
  // admitted while draining, so the call can finish.
  bool continues_call = false;
};

// Engine-wide counters and gauges, read by metrics and by the router's load reports.
struct EngineStats {
  int running = 0;
  int waiting = 0;
  int64_t kv_pages_total = 0;
  int64_t kv_pages_free = 0;
  int64_t kv_pages_used = 0;
  int64_t kv_pages_cached = 0;     // free-able pages kept for prefix reuse
  int64_t preemptions_total = 0;
  int64_t prefix_queries_tokens = 0;
  int64_t prefix_hits_tokens = 0;
  int64_t prefix_queries_pages = 0;
  int64_t prefix_hits_pages = 0;
  int64_t prompt_tokens_total = 0;
  int64_t generated_tokens_total = 0;
  int64_t steps_total = 0;
  int64_t spec_drafts_total = 0;  // verify steps (a sequence's drafted tokens, checked)
  int64_t spec_draft_tokens_total = 0;
  int64_t spec_accepted_tokens_total = 0;
  // --device cuda with the tiered KV cache (--kv-device-pages): device page-cache lookups over
  // the tiered layers, and bytes copied host -> device / read from host memory directly.
  int64_t kv_tier_hits = 0, kv_tier_misses = 0;
  int64_t kv_tier_bytes_moved = 0, kv_tier_bytes_direct = 0;
  double last_step_time = 0;       // NowSeconds() of the last step that made progress
  bool draining = false;
};

// Observes what the engine does, for metrics. Called on the engine thread; must be cheap.
class EngineObserver {
 public:
  virtual ~EngineObserver() = default;
  virtual void OnRequestFinished(FinishReason /*reason*/, const RequestUsage& /*usage*/) {}
  virtual void OnTokenEmitted(double /*inter_token_seconds*/) {}  // per decode token after the first
  virtual void OnStep(int /*batch_size*/, int /*prefill_tokens*/, double /*seconds*/) {}
  virtual void OnSelectionStep(const SelectionSummary& /*step*/) {}  // one decode step's totals
  virtual void OnPreemption() {}
};

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  ~Engine();

  // Validates and enqueues. InvalidArgument (names the field: prompt empty or too long, bad
  // sampling value, unknown policy...), ResourceExhausted (queue full), Unavailable (draining).
  absl::Status Submit(GenerateRequest request, std::shared_ptr<RequestSink> sink);
  // Cancels a request by id (queued or running) at the next step; its sink gets
  // OnFinish(kAbort). Always true: the id is queued, and an unknown one is ignored then.
  bool Abort(const std::string& request_id);

  void SetObserver(EngineObserver* observer);  // before Start
  void Start();   // starts the engine thread
  void Drain();   // stop admitting; running and queued requests finish
  void Stop();    // aborts everything left and joins the thread
  // Runs steps on the caller's thread until no request is left (no engine thread; CLI, tests).
  void RunUntilIdle();

  EngineStats Stats() const;
  const ModelConfig& model_config() const;
  const Tokenizer& tokenizer() const;
  const TokenTable& token_table() const;  // MakeTokenTable(tokenizer())
  const EngineOptions& options() const;
  int max_context() const;
  // EngineOptions::served_model_name, or the model's own name, or its path.
  const std::string& served_name() const;
  // The LoRA adapters, by id (GenerateRequest::lora - 1): EngineOptions::loras, then those
  // loaded at run time; an unloaded one keeps its slot with an empty name. A snapshot.
  std::vector<LoraInfo> loras() const;
  // Runtime LoRA loading (the worker's --allow-runtime-lora; under tensor parallelism every rank
  // reads the path, and a load that a rank cannot read fails with FailedPrecondition): reads
  // the adapter on the caller's thread (a GGUF adapter or a PEFT folder, as --lora), then the
  // engine thread adds it between steps; blocks until then. Errors name the problem:
  // InvalidArgument (a bad name or file), AlreadyExists, FailedPrecondition, ResourceExhausted
  // (no device memory for it). Returns its id.
  // `loaded_at`: the Unix time to record as the load's (a copy of another worker's load keeps
  // that load's); 0: now.
  absl::StatusOr<int> LoadLora(const std::string& name, const std::string& path,
                               double loaded_at = 0);
  // New requests can no longer name it; its weights are freed once no request uses it.
  // NotFound when no adapter has that name.
  absl::Status UnloadLora(const std::string& name);
  // Names unloaded (UnloadLora) and not loaded again since, with the Unix time of the unload.
  std::map<std::string, double> unloaded_loras() const;
  // A one-token forward on a scratch sequence: the deep health probe.
  absl::Status HealthProbe();
  // OK unless the tensor-parallel group failed (a collective error or timeout: a rank died).
  // Once failed, running requests end with the error and Submit returns Unavailable.
  absl::Status TpStatus() const;

  class Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tinyserve
