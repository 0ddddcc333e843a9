#include "worker/engine/engine.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "common/timer.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "worker/engine/ngram_draft.h"
#include "worker/kv/page_pool.h"
#include "worker/kv/paged_kv_cache.h"
#include "worker/model/weight_source.h"
#include "worker/runner/cuda_runner.h"
#include "worker/runner/transformer.h"
#include "worker/sampling/grammar.h"
#include "worker/sampling/json_schema.h"
#include "worker/sampling/reasoning_constraint.h"
#include "worker/sampling/regex.h"
#include "worker/sampling/sampler.h"
#include "worker/select/selector.h"
#include "worker/tp/communicator.h"
#include "worker/tp/step_message.h"

namespace tinyserve {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kLength: return "length";
    case FinishReason::kEos: return "eos";
    case FinishReason::kStopToken: return "stop_token";
    case FinishReason::kStopString: return "stop";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kDeadline: return "deadline";
    case FinishReason::kError: return "error";
  }
  return "unknown";
}

namespace {

const std::vector<std::string> kNoStops;

// One request in the engine.
struct Sequence {
  GenerateRequest req;
  std::shared_ptr<RequestSink> sink;
  std::vector<int32_t> tokens;   // prompt + generated
  int prompt_len = 0;
  int64_t computed = 0;          // tokens whose K/V are in the cache
  std::vector<int32_t> pages;    // page table
  std::vector<uint64_t> hashes;  // chained hash of each full page registered so far
  std::unique_ptr<Sampler> sampler;
  std::shared_ptr<const JsonSchema> json_schema;  // json_schema output: its compiled schema
  std::shared_ptr<const Regex> regex;             // regex output: its automaton
  absl::Status error;  // why it ends with kError when Finish is given no status
  // prompt_logprobs: one per prompt token, filled as the prefill's rows come, sent with the
  // first token (then dropped).
  std::vector<GeneratedToken> prompt_lp;
  bool prompt_lp_sent = false;
  bool WantsPromptLogprobs() const {
    return req.sampling.prompt_logprobs >= 0 && !prompt_lp_sent && computed < prompt_len;
  }
  std::unique_ptr<Policy> policy;
  // This step's speculative rows: the last sampled token, then the drafted ones (empty: none).
  std::vector<int32_t> verify;
  // Speculation's running estimate of P(a drafted token is accepted), from verified drafts and
  // from the first token of drafts a plain step declined (spec_probe, checked when it samples).
  double spec_alpha = 0.5;
  int32_t spec_probe = -1;
  void ObserveDraft(bool accepted) { spec_alpha += 0.1 * ((accepted ? 1.0 : 0.0) - spec_alpha); }
  std::vector<float> pooled;  // an embedding request's pooled hidden state [dim]
  Utf8StreamDecoder utf8;
  std::string held;              // decoded text held back (could start a stop string)
  RequestUsage usage;
  double arrival = 0, scheduled = -1, first_token = -1, last_token = -1;
  int generated = 0;     // output tokens, a continuation's included
  bool started = false;  // a token was sampled here (the prefill is done)
  bool finished = false;
  bool internal = false;         // health probes: not counted in metrics
  int64_t order = 0;             // admission order (preemption picks the newest)
  // Scheduling rank: priority first (lower sooner), then admission order. The batch's token
  // budget goes in this order, and preemption takes the highest rank first.
  std::pair<int, int64_t> rank() const { return {req.priority, order}; }
  // Tensor parallelism: followers key their copy of the policy by uid; announced once the
  // spec was sent with the sequence's first step.
  uint64_t uid = 0;
  SelectionSpec spec;
  uint64_t policy_seed = 0;
  bool tp_announced = false;
};

// Puts a sequence in a queue ordered by priority, ahead of the others of its level (a preempted
// sequence, or one that could not be admitted, goes first again) and behind higher levels.
void AheadOfItsLevel(std::deque<std::unique_ptr<Sequence>>& queue, std::unique_ptr<Sequence> s) {
  auto at = std::find_if(queue.begin(), queue.end(),
                         [&](const auto& w) { return w->req.priority >= s->req.priority; });
  queue.insert(at, std::move(s));
}

}  // namespace

class Engine::Impl {
 public:
  EngineOptions opts;
  std::unique_ptr<WeightSource> source;
  std::unique_ptr<Tokenizer> tok;
  std::vector<int32_t> eog_ids;  // end-of-generation ids (min_tokens holds them back)
  std::vector<int32_t> think_close_ids;           // "\n</think>", forced by a thinking budget
  std::shared_ptr<const TokenTable> token_table;  // for constrained (JSON) decoding
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<Communicator> comm;
  // The model: on the CPU, runner + kv; with --device cuda, cuda (which owns its device cache).
  std::unique_ptr<TransformerRunner> runner;
  std::unique_ptr<PagedKvCache> kv;
  std::unique_ptr<CudaRunner> cuda;
  // GenerateRequest::lora - 1; an unloaded adapter keeps its slot with an empty name (ids are
  // never reused, so cached pages salted by an id stay its own). GUARDED_BY(mu) once serving.
  std::vector<LoraInfo> loras;
  // Runtime LoRA loading (Engine::LoadLora): adapters read on the caller's thread, installed
  // by the engine thread between steps. GUARDED_BY(mu).
  struct LoraInstall {
    TransformerRunner::PreparedLora weights;  // the CPU runner's
    CudaRunner::PreparedLora cuda_weights;    // or the CUDA runner's
    LoraInfo info;
    std::promise<absl::StatusOr<int>> id;
  };
  std::vector<std::unique_ptr<LoraInstall>> lora_installs;
  std::vector<int> lora_unloaded;  // GUARDED_BY(mu) ids whose weights are to be freed
  std::map<std::string, double> lora_unloaded_at;  // GUARDED_BY(mu) Engine::unloaded_loras
  std::vector<int> lora_freeing;   // engine thread: those ids, freed once no sequence uses them
  void ApplyLoraChanges();
  void FailPendingLoras();
  bool started = false;  // GUARDED_BY(mu) an engine thread runs (Start)
  const ModelConfig& model() const { return source->config(); }
  std::unique_ptr<PagePool> pages;
  int max_context = 0;
  std::string served_name;  // Engine::served_name
  EngineObserver* observer = nullptr;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::deque<std::unique_ptr<Sequence>> waiting;   // guarded by mu
  std::vector<std::string> aborts;                  // guarded by mu
  bool stop = false, draining = false;              // guarded by mu
  EngineStats stats;                                // guarded by mu (snapshot)
  std::thread thread;

  // Engine thread only.
  std::vector<std::unique_ptr<Sequence>> running;
  std::deque<std::unique_ptr<Sequence>> local_waiting;  // preempted, ahead of the queue
  int64_t next_order = 0;
  std::vector<float> logits;

  // Tensor parallelism (rank 0 of a group; tp == nullptr otherwise). Engine thread only, but
  // tp_status, guarded by mu, is read by Submit and TpStatus.
  Communicator* tp = nullptr;
  absl::Status tp_status;                 // guarded by mu
  std::vector<uint64_t> tp_finished;      // sequences to drop on the followers
  std::vector<int32_t> tp_reset_pages;    // pages allocated since the last step message
  double tp_last_send = 0;                // NowSeconds() of the last message to the group
  bool tp_shutdown_sent = false;
  std::atomic<uint64_t> next_uid{1};

  absl::Status Validate(const GenerateRequest& r) const;
  void Loop();
  bool Step();  // false when there was nothing to do
  void Finish(std::unique_ptr<Sequence>& s, FinishReason reason, absl::Status status);
  void FreePages(Sequence& s);
  bool Admit(Sequence& s);
  bool EnsurePages(Sequence& s, int64_t upto);
  void Preempt(Sequence& s);
  // Drafts up to `room` speculative tokens for a decoding sequence into s.verify; returns how
  // many (0: it decodes one token as usual).
  int Draft(Sequence& s, int room);
  // Samples a verified sequence's rows in order while they agree with the draft; rolls the
  // rejected rows out of the cache. Returns why the sequence ends, if it does.
  std::optional<FinishReason> Verify(Sequence& s, float* logits, int rows, bool selected);
  void ReportSelection(const Sequence& s);
  // Registers the sequence's newly full, computed pages for prefix reuse.
  void RegisterFullPages(Sequence& s);
  // Appends a sampled token and streams it; returns why the sequence ends, if it does.
  std::optional<FinishReason> Emit(Sequence& s, const SampleResult& r);
  // A prefill chunk's n logits rows (all_logits): the prompt tokens they predict, into
  // s.prompt_lp (each position once, so a recomputed prefill adds nothing).
  void PromptLogprobs(Sequence& s, const float* rows, int n);
  // The text of one output token: end-of-generation and stop ids, stop strings, UTF-8
  // completion and the held-back tail. Returns why the request ends, if it does.
  std::optional<FinishReason> TakeText(Sequence& s, int32_t id, std::string* text);
  void PublishStats();
  // Tensor parallelism: send a message to the followers; a failure breaks the group.
  absl::Status TpSend(const StepMessage& m);
  void TpFail(const absl::Status& s);
  bool TpFailed() const;
  void TpHeartbeat();
  void TpShutdown();
};

absl::Status Engine::Impl::Validate(const GenerateRequest& r) const {
  if (r.prompt_ids.empty()) return absl::InvalidArgumentError("prompt: empty prompt");
  const int vocab = model().vocab_size;
  for (int32_t id : r.prompt_ids)
    if (id < 0 || id >= vocab)
      return absl::InvalidArgumentError(
          absl::StrCat("prompt: token id ", id, " is out of range [0, ", vocab, ")"));
  if (static_cast<int>(r.prompt_ids.size()) >= max_context)
    return absl::InvalidArgumentError(absl::StrCat("prompt: ", r.prompt_ids.size(),
                                                   " tokens leave no room in the context of ",
                                                   max_context, " tokens"));
  for (int32_t id : r.continuation_ids)
    if (id < 0 || id >= vocab)
      return absl::InvalidArgumentError(
          absl::StrCat("continuation: token id ", id, " is out of range [0, ", vocab, ")"));
  if (!r.continuation_ids.empty() &&
      (r.prompt_ids.size() + r.continuation_ids.size() >= static_cast<size_t>(max_context) ||
       static_cast<int>(r.continuation_ids.size()) >= r.sampling.max_tokens))
    return absl::InvalidArgumentError(absl::StrCat("continuation: ", r.continuation_ids.size(),
                                                   " tokens leave nothing to generate"));
  if (r.pooling != Pooling::kNone) {
    if (!r.continuation_ids.empty())
      return absl::InvalidArgumentError("continuation: an embedding request generates nothing");
  }
  TS_RETURN_IF_ERROR(ValidateSamplingParams(r.sampling, vocab, max_context));
  if (r.selection) {
    TS_RETURN_IF_ERROR(ValidateSelectionSpec(*r.selection, opts.page_size));
    if (cuda) TS_RETURN_IF_ERROR(ValidateCudaSelection(*r.selection));
  }
  return absl::OkStatus();
}

void Engine::Impl::FreePages(Sequence& s) {
  for (int32_t p : s.pages) pages->Unref(p);
  s.pages.clear();
  s.hashes.clear();
  s.computed = 0;
}

void Engine::Impl::Finish(std::unique_ptr<Sequence>& s, FinishReason reason, absl::Status status) {
  if (s->finished) return;
  s->finished = true;
  if (reason == FinishReason::kError && status.ok()) status = s->error;
  FreePages(*s);
  if (tp != nullptr && s->tp_announced) tp_finished.push_back(s->uid);
  const double now = NowSeconds();
  RequestUsage& u = s->usage;
  u.prompt_tokens = s->prompt_len;
  u.generated_tokens = s->generated;
  u.e2e_seconds = now - s->arrival;
  if (s->first_token >= 0) u.decode_seconds = s->last_token - s->first_token;
  if (s->policy) {
    const SelectionStats& st = s->policy->stats();
    SelectionSummary& sel = u.selection;
    sel.policy = s->policy->name();
    sel.steps = st.steps;
    sel.pages_scored = st.total.pages_scored;
    sel.pages_selected = st.total.pages_selected;
    sel.kv_bytes_read = st.total.kv_bytes_read;
    sel.kv_bytes_dense = st.total.kv_bytes_dense;
    sel.page_hit_rate = st.PageHitRate();
    sel.mass_recall = st.MassRecall();
    sel.reuse = st.Reuse();
    sel.select_seconds = st.total.select_seconds;
  }
  if (observer != nullptr && !s->internal) observer->OnRequestFinished(reason, u);
  {
    std::lock_guard<std::mutex> lock(mu);
    stats.prompt_tokens_total += s->internal ? 0 : s->prompt_len;
  }
  s->sink->OnFinish(reason, u, std::move(status));
}

bool Engine::Impl::Admit(Sequence& s) {
  // Prefix cache: reuse full pages of the prompt, but always leave one token to compute so
  // the request gets logits.
  const int ps = opts.page_size;
  // (Not for prompt logprobs still to compute: they need every prompt row's logits.)
  // (Nor for mean pooling, which needs every prompt token's hidden state.)
  const bool reuse = opts.prefix_caching &&
                     (s.req.sampling.prompt_logprobs < 0 || s.prompt_lp_sent) &&
                     s.req.pooling != Pooling::kMean;
  const int64_t reusable = reuse ? (s.prompt_len - 1) / ps : 0;
  std::vector<int32_t> hit_pages;
  std::vector<uint64_t> hit_hashes;
  uint64_t h = s.req.cache_salt;
  for (int64_t i = 0; i < reusable; ++i) {
    h = PagePool::BlockHash(h, &s.tokens[i * ps], ps);
    const int32_t p = pages->Lookup(h, &s.tokens[i * ps]);
    if (p < 0) break;
    hit_pages.push_back(p);
    hit_hashes.push_back(h);
  }
  // Pages for the rest of the prompt and the first generated token.
  const int64_t need = (s.prompt_len + 1 + ps - 1) / ps - static_cast<int64_t>(hit_pages.size());
  if (pages->available() < need) {
    for (int32_t p : hit_pages) pages->Unref(p);
    return false;
  }
  s.pages = std::move(hit_pages);
  s.hashes = std::move(hit_hashes);
  s.computed = static_cast<int64_t>(s.pages.size()) * ps;
  std::fill(s.pooled.begin(), s.pooled.end(), 0.0f);  // (re)computed from the first row
  if (s.usage.preemptions == 0) {
    s.usage.cached_tokens = static_cast<int>(s.computed);
    std::lock_guard<std::mutex> lock(mu);
    stats.prefix_queries_tokens += s.prompt_len;
    stats.prefix_hits_tokens += s.computed;
    stats.prefix_queries_pages += reusable;
    stats.prefix_hits_pages += static_cast<int64_t>(s.pages.size());
  }
  return true;
}

bool Engine::Impl::EnsurePages(Sequence& s, int64_t upto) {
  const int ps = opts.page_size;
  while (static_cast<int64_t>(s.pages.size()) * ps < upto) {
    const int32_t p = pages->Allocate();
    if (p < 0) return false;
    if (kv) kv->ResetPage(p);
    if (tp != nullptr) tp_reset_pages.push_back(p);
    s.pages.push_back(p);
  }
  return true;
}

void Engine::Impl::Preempt(Sequence& s) {
  // Recompute preemption: drop the KV, keep the tokens; the sequence re-prefills later.
  FreePages(s);
  s.usage.preemptions++;
  {
    std::lock_guard<std::mutex> lock(mu);
    stats.preemptions_total++;
  }
  if (observer != nullptr) observer->OnPreemption();
}

std::optional<FinishReason> Engine::Impl::TakeText(Sequence& s, int32_t id, std::string* text) {
  const SamplingParams& sp = s.req.sampling;
  std::optional<FinishReason> reason;
  const bool eog = !sp.ignore_eos && tok->IsEog(id);
  const bool stop_id =
      std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), id) != sp.stop_token_ids.end();
  if (eog) {
    reason = FinishReason::kEos;
  } else if (stop_id) {
    reason = FinishReason::kStopToken;
    s.usage.stop_token_id = id;
  } else {
    if (!sp.skip_special_tokens || !tok->IsControl(id)) s.held += s.utf8.Push(tok->TokenBytes(id));
    // A stop string ends the output before it; text that could begin one is held back.
    // Before min_tokens nothing stops it.
    size_t cut = std::string::npos;
    const std::string* matched = nullptr;  // the stop string found first in the text
    for (const auto& stop : s.generated >= sp.min_tokens ? sp.stop : kNoStops) {
      const size_t at = s.held.find(stop);
      if (at != std::string::npos && at < cut) {
        cut = at;
        matched = &stop;
      }
    }
    if (cut != std::string::npos) {
      *text = s.held.substr(0, cut);
      s.held.clear();
      reason = FinishReason::kStopString;
      s.usage.stop_string = *matched;
    } else {
      size_t keep = 0;
      for (const auto& stop : sp.stop)
        for (size_t k = std::min(stop.size() - 1, s.held.size()); k > keep; --k)
          if (s.held.compare(s.held.size() - k, k, stop, 0, k) == 0) {
            keep = k;
            break;
          }
      *text = s.held.substr(0, s.held.size() - keep);
      s.held.erase(0, s.held.size() - keep);
    }
  }
  return reason;
}

void Engine::Impl::PromptLogprobs(Sequence& s, const float* rows, int n) {
  const int vocab = model().vocab_size;
  const int top_n = s.req.sampling.prompt_logprobs;
  if (s.prompt_lp.empty()) {
    GeneratedToken first;  // no context: no logprob
    first.id = s.tokens[0];
    s.prompt_lp.push_back(first);
  }
  // Row j holds the distribution after position computed + j: the next prompt token's.
  for (int j = 0; j < n; ++j) {
    const int64_t next = s.computed + j + 1;
    if (next >= s.prompt_len || next != static_cast<int64_t>(s.prompt_lp.size())) continue;
    SampleResult r;
    r.id = s.tokens[next];
    GeneratedToken t;
    LogprobsOf(rows + static_cast<size_t>(j) * vocab, vocab, top_n, &r, &t.rank);
    t.id = r.id;
    t.logprob = r.logprob;
    for (auto& [id, lp] : r.top) t.top.push_back({id, lp});
    s.prompt_lp.push_back(std::move(t));
  }
}

std::optional<FinishReason> Engine::Impl::Emit(Sequence& s, const SampleResult& r) {
  const double now = NowSeconds();
  GeneratedToken t;
  t.id = r.id;
  t.logprob = r.logprob;
  for (auto& [id, lp] : r.top) t.top.push_back({id, lp});
  s.tokens.push_back(r.id);
  s.generated++;
  if (s.first_token < 0) {
    s.first_token = now;
    s.usage.ttft_seconds = now - s.arrival;
    s.usage.prefill_seconds = now - s.scheduled;
  } else if (observer != nullptr && !s.internal) {
    observer->OnTokenEmitted(now - s.last_token);
  }
  s.last_token = now;
  s.started = true;

  const SamplingParams& sp = s.req.sampling;
  std::optional<FinishReason> reason = TakeText(s, r.id, &t.text);
  if (!reason && (s.generated >= sp.max_tokens || static_cast<int>(s.tokens.size()) >= max_context))
    reason = FinishReason::kLength;
  if (absl::Status c = s.sampler->ConstraintStatus(); !c.ok()) {  // the grammar gave up
    s.error = std::move(c);
    reason = FinishReason::kError;
  }
  if (reason && *reason != FinishReason::kStopString) {
    t.text += s.held + s.utf8.Flush();
    s.held.clear();
  }
  s.usage.generated_tokens = s.generated;
  s.usage.prompt_tokens = s.prompt_len;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!s.internal) stats.generated_tokens_total++;
  }
  if (s.req.sampling.prompt_logprobs >= 0 && !s.prompt_lp_sent) {
    s.sink->OnPromptLogprobs(s.prompt_lp);
    s.prompt_lp_sent = true;
    std::vector<GeneratedToken>().swap(s.prompt_lp);
  }
  s.sink->OnTokens({t}, s.usage);
  return reason;
}

int Engine::Impl::Draft(Sequence& s, int room) {
  s.verify.clear();
  const int ps = opts.page_size;
  const int64_t p = s.computed;  // the last sampled token's position; s.tokens.size() == p + 1
  int64_t k = std::min<int64_t>({opts.spec_tokens, room,
                                 s.req.sampling.max_tokens - s.generated - 1,  // one per row
                                 max_context - 1 - p});
  // Rows past the pages held take at most one more page, and only while the pool has a page
  // for every running sequence besides: speculation never preempts anyone.
  const int64_t held = static_cast<int64_t>(s.pages.size()) * ps;
  const int64_t need = (p / ps + 1) * ps;  // the page of position p
  const bool spare = pages->available() > static_cast<int64_t>(running.size()) + 1;
  k = std::min(k, std::max(held, need + (spare ? ps : 0)) - 1 - p);
  // int8 pages quantize when their last slot is written: a draft row may not write one, since
  // a rejected row there could not be rolled back (PagedKvCache::TruncatePage).
  if (kv && kv->dtype() == KvDtype::kInt8) {
    const int64_t r = p % ps;
    k = std::min<int64_t>(k, r < ps - 1 ? ps - 2 - r : ps - 1);
  }
  // Past the budget each row selects its own pages, which needs a policy whose choice is a
  // function of the row alone.
  if (k <= 0 || (s.policy && !s.policy->DenseAt(p + 1 + k) && !s.policy->SelectsPerRow())) return 0;
  std::vector<int32_t> draft;
  NgramDraft(s.tokens.data(), static_cast<int64_t>(s.tokens.size()), opts.spec_ngram_min,
             opts.spec_ngram_max, static_cast<int>(k), &draft);
  if (draft.empty()) return 0;
  // How many to verify: the most tokens per unit of step time. A step emits (1 - a^(k+1)) /
  // (1 - a) tokens on average with k drafts accepted each with probability a; each extra row
  // costs little in the matrix products (the weights are read once) but its own attention,
  // about rho = ctx / (ctx + C) of a plain step, ctx the tokens a step attends (the budget once
  // selection applies), C the context whose K/V bytes equal the weights' (per token: 1 + k rho).
  const double a = std::min(s.spec_alpha, 0.999);
  const double ctx = s.policy ? s.policy->AttendedTokens(p + 1 + k) : static_cast<double>(p + 1);
  const double c = static_cast<double>(runner->WeightBytes()) / kv->BytesPerToken();
  const double rho = ctx / (ctx + c);
  int best = 0;
  double best_gain = 1.02;  // a plain step, with a margin against noise in the estimate
  double emitted = 1, ak = 1;
  for (int n = 1; n <= static_cast<int>(draft.size()); ++n) {
    ak *= a;
    emitted += ak;
    const double gain = emitted / (1 + n * rho);
    if (gain > best_gain) {
      best_gain = gain;
      best = n;
    }
  }
  if (best == 0) {
    s.spec_probe = draft[0];
    return 0;
  }
  draft.resize(best);
  s.verify.reserve(draft.size() + 1);
  s.verify.push_back(s.tokens[p]);
  s.verify.insert(s.verify.end(), draft.begin(), draft.end());
  return static_cast<int>(draft.size());
}

std::optional<FinishReason> Engine::Impl::Verify(Sequence& s, float* logits, int rows,
                                                 bool selected) {
  const int vocab = model().vocab_size;
  const int64_t p = s.computed;
  std::optional<FinishReason> reason;
  int e = 0;  // tokens emitted; row i's input (verify[i]) is valid while i < e
  while (e < rows) {
    // Row e saw the prompt, the output and the drafts before it, all accepted: it samples as a
    // plain decode step at position p + e would.
    const SampleResult r = s.sampler->Sample(logits + static_cast<size_t>(e) * vocab, vocab,
                                             s.tokens, s.tokens.size() - s.generated);
    if (s.policy) {
      if (selected) {
        s.policy->EndRow(e);
      } else {
        s.policy->RecordDenseStep(p + e + 1);
      }
      ReportSelection(s);
    }
    ++e;
    reason = Emit(s, r);
    if (reason || e == rows) break;
    s.ObserveDraft(r.id == s.verify[e]);
    if (r.id != s.verify[e]) break;
  }
  s.computed = p + e;
  s.usage.spec_draft_tokens += rows - 1;
  s.usage.spec_accepted_tokens += e - 1;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!s.internal) {
      stats.spec_drafts_total++;
      stats.spec_draft_tokens_total += rows - 1;
      stats.spec_accepted_tokens_total += e - 1;
    }
  }
  // Rows e.. hold rejected tokens: forget them so each page's box is what a plain decode would
  // have built (a finished sequence frees its pages instead).
  if (!reason) {
    const int ps = opts.page_size;
    for (int64_t pg = (p + e) / ps; pg <= (p + rows - 1) / ps; ++pg)
      kv->TruncatePage(s.pages[pg], static_cast<int>(std::max<int64_t>(0, p + e - pg * ps)));
  }
  return reason;
}

void Engine::Impl::RegisterFullPages(Sequence& s) {
  const int ps = opts.page_size;
  while (opts.prefix_caching && static_cast<int64_t>(s.hashes.size() + 1) * ps <= s.computed) {
    const size_t i = s.hashes.size();
    const uint64_t prev = i == 0 ? s.req.cache_salt : s.hashes[i - 1];
    const uint64_t h = PagePool::BlockHash(prev, &s.tokens[i * ps], ps);
    pages->Register(s.pages[i], h, &s.tokens[i * ps]);
    s.hashes.push_back(h);
  }
}

void Engine::Impl::ReportSelection(const Sequence& s) {
  if (observer == nullptr || s.internal) return;
  const StepStats& st = s.policy->last_step();
  SelectionSummary one;
  one.policy = s.policy->name();
  one.steps = 1;
  one.pages_scored = st.pages_scored;
  one.pages_selected = st.pages_selected;
  one.kv_bytes_read = st.kv_bytes_read;
  one.kv_bytes_dense = st.kv_bytes_dense;
  one.page_hit_rate = st.oracle_samples ? st.hit_rate_sum / st.oracle_samples : -1;
  one.mass_recall = st.oracle_samples ? st.mass_recall_sum / st.oracle_samples : -1;
  one.select_seconds = st.select_seconds;
  observer->OnSelectionStep(one);
}

bool Engine::Impl::Step() {
  const double now = NowSeconds();
  // 1. Aborts and deadlines.
  std::vector<std::string> to_abort;
  std::vector<std::pair<std::unique_ptr<Sequence>, FinishReason>> leaving;
  {
    std::lock_guard<std::mutex> lock(mu);
    to_abort.swap(aborts);
    // Queued requests past their deadline or aborted leave without touching the cache (finished
    // after the lock: a sink may Submit).
    for (auto it = waiting.begin(); it != waiting.end();) {
      auto& s = *it;
      const bool ab = std::find(to_abort.begin(), to_abort.end(), s->req.request_id) != to_abort.end();
      const bool late = s->req.deadline > 0 && now > s->req.deadline;
      if (ab || late || stop) {
        leaving.emplace_back(std::move(s), late ? FinishReason::kDeadline : FinishReason::kAbort);
        it = waiting.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& [s, reason] : leaving) Finish(s, reason, absl::OkStatus());
  bool stopping;
  {
    std::lock_guard<std::mutex> lock(mu);
    stopping = stop;
  }
  auto sweep = [&](auto& list) {
    for (auto& s : list) {
      if (!s) continue;
      const bool ab = stopping || std::find(to_abort.begin(), to_abort.end(), s->req.request_id) != to_abort.end();
      const bool late = s->req.deadline > 0 && now > s->req.deadline;
      if (ab || late) Finish(s, late ? FinishReason::kDeadline : FinishReason::kAbort, absl::OkStatus());
    }
  };
  sweep(running);
  sweep(local_waiting);
  auto prune = [](auto& list) {
    list.erase(std::remove_if(list.begin(), list.end(), [](auto& s) { return !s || s->finished; }),
               list.end());
  };
  prune(running);
  prune(local_waiting);
  if (TpFailed()) {
    // The group is gone: nothing can run. Everything admitted or queued ends with the error.
    absl::Status err;
    std::deque<std::unique_ptr<Sequence>> queued;
    {
      std::lock_guard<std::mutex> lock(mu);
      err = tp_status;
      queued.swap(waiting);
    }
    for (auto& s : queued) Finish(s, FinishReason::kError, err);
    for (auto& s : running) Finish(s, FinishReason::kError, err);
    for (auto& s : local_waiting) Finish(s, FinishReason::kError, err);
    running.clear();
    local_waiting.clear();
    PublishStats();
    return false;
  }

  // 2. Admission, while slots and pages allow: the preempted sequences and the queue, best
  // priority first (preempted ones first within a level). A request whose priority is higher
  // (a lower value) than a running sequence's takes its place when the batch or the pages are
  // full: the lowest-ranked such sequence is preempted (recompute), as vLLM's priority
  // scheduling does.
  while (true) {
    std::unique_ptr<Sequence> s;
    bool from_queue = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!waiting.empty() && (local_waiting.empty() || waiting.front()->req.priority <
                                                            local_waiting.front()->req.priority)) {
        s = std::move(waiting.front());
        waiting.pop_front();
        from_queue = true;
      }
    }
    if (!s) {
      if (local_waiting.empty()) break;
      s = std::move(local_waiting.front());
      local_waiting.pop_front();
    }
    bool admitted = false;
    while (!(admitted = static_cast<int>(running.size()) < opts.max_batch && Admit(*s))) {
      size_t victim = running.size();
      for (size_t j = 0; j < running.size(); ++j)
        if (running[j]->req.priority > s->req.priority &&
            (victim == running.size() || running[j]->rank() > running[victim]->rank()))
          victim = j;
      if (victim == running.size()) break;
      Preempt(*running[victim]);
      AheadOfItsLevel(local_waiting, std::move(running[victim]));
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(victim));
    }
    if (!admitted) {
      if (from_queue) {
        std::lock_guard<std::mutex> lock(mu);
        AheadOfItsLevel(waiting, std::move(s));  // back in the queue: counts against max_queue
      } else {
        AheadOfItsLevel(local_waiting, std::move(s));
      }
      break;
    }
    if (s->scheduled < 0) {
      s->scheduled = NowSeconds();
      s->usage.queue_seconds = s->scheduled - s->arrival;
    }
    s->order = next_order++;
    running.push_back(std::move(s));
  }
  {
    // Now, not at the step's end: Submit counts the free batch slots from it, and the requests
    // just taken from the queue no longer count as waiting.
    std::lock_guard<std::mutex> lock(mu);
    stats.running = static_cast<int>(running.size());
    stats.waiting = static_cast<int>(waiting.size() + local_waiting.size());
  }
  if (running.empty()) {
    PublishStats();
    return false;
  }

  // 3. Build the batch: decode tokens first, then prefill chunks within the token budget.
  std::sort(running.begin(), running.end(), [](auto& a, auto& b) { return a->rank() < b->rank(); });
  int budget = std::max(opts.max_step_tokens, static_cast<int>(running.size()));
  std::vector<Sequence*> batch_seqs;
  std::vector<SeqInput> batch;
  StepMessage tp_msg;  // the same batch for the followers (tensor parallelism)
  std::vector<int> chunk(running.size(), 0);
  for (auto& s : running) {
    s->verify.clear();
    s->spec_probe = -1;
  }
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < running.size(); ++i) {
      Sequence& s = *running[i];
      const int64_t pending = static_cast<int64_t>(s.tokens.size()) - s.computed;
      const bool decode = pending == 1 && s.computed >= s.prompt_len;
      if ((pass == 0) != decode || pending <= 0 || budget <= 0) continue;
      chunk[i] = static_cast<int>(std::min<int64_t>(pending, budget));
      budget -= chunk[i];
    }
  }
  // Speculative rows take what the budget leaves after the decode tokens and prefill chunks,
  // and never push the step's matrix products onto a path whose rows' results would differ
  // from a plain step's (MatMulInvariantRows).
  if (opts.spec_tokens > 0) {
    int64_t rows = 0;
    for (int c : chunk) rows += c;
    const int64_t invariant = MatMulInvariantRows();
    for (size_t i = 0; i < running.size() && budget > 0; ++i) {
      if (chunk[i] != 1 || running[i]->computed < running[i]->prompt_len) continue;
      const int64_t room = rows <= invariant ? std::min<int64_t>(budget, invariant - rows) : budget;
      const int k = room > 0 ? Draft(*running[i], static_cast<int>(room)) : 0;
      chunk[i] += k;
      budget -= k;
      rows += k;
    }
  }
  // Pages for the chunks; when the pool runs dry, preempt the newest sequences.
  for (size_t i = 0; i < running.size(); ++i) {
    if (chunk[i] == 0) continue;
    Sequence& s = *running[i];
    while (!EnsurePages(s, s.computed + chunk[i])) {
      // Victim: the lowest-priority, newest other running sequence still holding pages that
      // ranks below this one, else this one.
      Sequence* victim = nullptr;
      for (size_t j = running.size(); j-- > 0;)
        if (running[j].get() != &s && !running[j]->pages.empty() &&
            (victim == nullptr || running[j]->rank() > victim->rank()) &&
            running[j]->rank() > s.rank())
          victim = running[j].get();
      if (victim == nullptr) victim = &s;
      Preempt(*victim);
      victim->verify.clear();
      for (size_t j = 0; j < running.size(); ++j)
        if (running[j].get() == victim) chunk[j] = 0;
      if (victim == &s) break;
    }
  }
  for (size_t i = 0; i < running.size(); ++i) {
    Sequence& s = *running[i];
    if (chunk[i] == 0 || s.pages.empty()) continue;
    SeqInput in;
    in.tokens = s.verify.empty() ? &s.tokens[s.computed] : s.verify.data();
    in.n = chunk[i];
    in.start_pos = s.computed;
    in.pages = &s.pages;
    in.decode_rows = !s.verify.empty();
    in.all_logits = in.decode_rows || s.WantsPromptLogprobs();
    in.lora = s.req.lora;
    in.pooling = s.req.pooling;
    in.pooled = s.pooled.empty() ? nullptr : s.pooled.data();
    const bool decode = chunk[i] == 1 && s.computed >= s.prompt_len;
    // A verification past the budget selects row by row (Draft checked SelectsPerRow); within
    // it the rows attend densely, their K/V read once.
    const bool sparse_verify =
        !s.verify.empty() && s.policy && !s.policy->DenseAt(s.computed + chunk[i]);
    if ((decode || sparse_verify) && s.policy && !cuda) {
      s.policy->BeginStep(s.computed + 1, chunk[i]);
      in.selector = s.policy.get();
    }
    batch.push_back(in);
    batch_seqs.push_back(&s);
    if (tp != nullptr) {
      StepEntry e;
      e.seq = s.uid;
      e.tokens.assign(in.tokens, in.tokens + in.n);
      e.start_pos = in.start_pos;
      e.pages = s.pages;
      e.all_logits = in.all_logits;
      e.lora = in.lora;
      e.select = in.selector != nullptr;
      e.begin_tokens = s.computed + 1;
      e.prefill_done =
          s.policy && !s.started && s.computed + in.n >= static_cast<int64_t>(s.tokens.size());
      e.has_spec = !s.tp_announced;
      if (e.has_spec) {
        e.spec = s.spec;
        e.seed = s.policy_seed;
        s.tp_announced = true;
      }
      tp_msg.entries.push_back(std::move(e));
    }
  }
  // Preempted sequences go back to the local queue.
  for (auto& s : running)
    if (s && s->pages.empty() && !s->finished) AheadOfItsLevel(local_waiting, std::move(s));
  prune(running);
  if (batch.empty()) {
    PublishStats();
    return !running.empty();
  }

  // 4. Forward (tensor parallelism: the followers get the batch first and run it alongside).
  Stopwatch sw;
  absl::Status fs;
  if (tp != nullptr) {
    tp_msg.finished.swap(tp_finished);
    tp_msg.reset_pages.swap(tp_reset_pages);
    fs = TpSend(tp_msg);
  }
  if (fs.ok() && cuda) {
    std::vector<const SelectionSpec*> selection(batch.size(), nullptr);
    for (size_t b = 0; b < batch.size(); ++b)
      if (batch[b].n == 1 && batch_seqs[b]->computed >= batch_seqs[b]->prompt_len)
        selection[b] = &batch_seqs[b]->spec;
    fs = cuda->Forward(batch, selection, &logits);
  } else if (fs.ok()) {
    fs = runner->Forward(batch, kv.get(), &logits);
  }
  if (!fs.ok() && tp != nullptr) TpFail(fs);
  const double step_s = sw.Seconds();
  int prefill_tokens = 0;
  for (size_t b = 0; b < batch.size(); ++b)
    prefill_tokens += batch[b].n > 1 && batch_seqs[b]->verify.empty() ? batch[b].n : 0;
  if (observer != nullptr) observer->OnStep(static_cast<int>(batch.size()), prefill_tokens, step_s);
  if (!fs.ok()) {
    TS_LOG(ERROR) << "forward failed: " << fs;
    for (auto& s : running) Finish(s, FinishReason::kError, fs);
    prune(running);
    return true;
  }

  // 5. Advance, register full pages for prefix reuse, sample where a sequence is caught up.
  const int vocab = model().vocab_size;
  std::vector<std::pair<Sequence*, FinishReason>> ended;
  size_t row = 0;  // the batch entry's first logits row
  for (size_t b = 0; b < batch.size(); ++b) {
    Sequence& s = *batch_seqs[b];
    float* out = &logits[row * vocab];
    row += batch[b].all_logits ? batch[b].n : 1;
    if (s.verify.empty() && batch[b].all_logits) {  // a prefill chunk with prompt logprobs
      PromptLogprobs(s, out, batch[b].n);
      out += static_cast<size_t>(batch[b].n - 1) * vocab;  // the last row samples
    }
    if (!s.verify.empty()) {
      std::optional<FinishReason> reason = Verify(s, out, batch[b].n, batch[b].selector != nullptr);
      RegisterFullPages(s);
      if (reason) ended.push_back({&s, *reason});
      continue;
    }
    StepStats device_step;
    const bool device_selected = cuda && s.policy && cuda->StepStatsOf(b, &device_step);
    if (batch[b].selector != nullptr || device_selected) {
      if (device_selected) {
        s.policy->RecordStep(device_step);
      } else {
        s.policy->EndStep();
      }
      ReportSelection(s);
    }
    s.computed += batch[b].n;
    RegisterFullPages(s);
    if (s.computed < static_cast<int64_t>(s.tokens.size())) continue;  // more prefill to do
    if (s.req.pooling != Pooling::kNone) {  // an embedding: done once its prompt is
      if (s.req.pooling == Pooling::kMean)
        for (float& v : s.pooled) v /= static_cast<float>(s.prompt_len);
      s.sink->OnEmbedding(s.pooled);
      ended.push_back({&s, FinishReason::kLength});
      continue;
    }
    if (!s.started && s.policy) s.policy->OnPrefill(s.computed);
    const SampleResult r = s.sampler->Sample(out, vocab, s.tokens, s.tokens.size() - s.generated);
    if (s.spec_probe >= 0) s.ObserveDraft(r.id == s.spec_probe);
    if (auto reason = Emit(s, r)) ended.push_back({&s, *reason});
  }
  for (auto& [seq, reason] : ended)
    for (auto& s : running)
      if (s.get() == seq) Finish(s, reason, absl::OkStatus());
  prune(running);
  {
    std::lock_guard<std::mutex> lock(mu);
    stats.steps_total++;
    stats.last_step_time = NowSeconds();
  }
  PublishStats();
  return true;
}

void Engine::Impl::PublishStats() {
  std::lock_guard<std::mutex> lock(mu);
  stats.running = static_cast<int>(running.size());
  stats.waiting = static_cast<int>(waiting.size() + local_waiting.size());
  stats.kv_pages_total = pages->num_pages();
  stats.kv_pages_free = pages->available();
  stats.kv_pages_used = pages->num_used();
  stats.kv_pages_cached = pages->num_cached();
  if (cuda) {
    const CudaRunnerTotals& t = cuda->totals();
    stats.kv_tier_hits = t.tier_hits;
    stats.kv_tier_misses = t.tier_misses;
    stats.kv_tier_bytes_moved = t.bytes_moved;
    stats.kv_tier_bytes_direct = t.bytes_direct;
  }
  stats.draining = draining;
}

void Engine::Impl::Loop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu);
      const auto has_work = [&] {
        return stop || !waiting.empty() || !aborts.empty() || !running.empty() ||
               !local_waiting.empty() || !lora_installs.empty() || !lora_unloaded.empty() ||
               !lora_freeing.empty();
      };
      if (tp != nullptr && tp_status.ok()) {
        cv.wait_for(lock, std::chrono::duration<double>(opts.tp_heartbeat_seconds), has_work);
      } else {
        cv.wait(lock, has_work);
      }
      if (stop && waiting.empty() && running.empty() && local_waiting.empty()) break;
    }
    // Tensor parallelism: no message for a heartbeat period -> prove the group is alive.
    if (tp != nullptr && NowSeconds() - tp_last_send >= opts.tp_heartbeat_seconds) TpHeartbeat();
    ApplyLoraChanges();
    if (!Step()) {
      // Nothing runnable (e.g. waiting for pages that no one will free): avoid spinning.
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, std::chrono::milliseconds(5));
    }
  }
  FailPendingLoras();
  PublishStats();
}

void Engine::Impl::FailPendingLoras() {
  // Loads that came too late: their callers get an error, not a wait.
  std::lock_guard<std::mutex> lock(mu);
  for (auto& op : lora_installs)
    op->id.set_value(absl::UnavailableError("the worker stopped before loading it"));
  lora_installs.clear();
}

void Engine::Impl::ApplyLoraChanges() {
  // The loads pending now (later ones wait for the next round), and the unloaded adapters whose
  // weights can go: those no sequence (running, preempted or queued) names any more.
  size_t n_loads = 0;
  std::vector<int> frees;
  {
    std::lock_guard<std::mutex> lock(mu);
    n_loads = lora_installs.size();
    lora_freeing.insert(lora_freeing.end(), lora_unloaded.begin(), lora_unloaded.end());
    lora_unloaded.clear();
    auto uses = [](const auto& list, int id) {
      return std::any_of(list.begin(), list.end(),
                         [id](const auto& s) { return s && s->req.lora == id; });
    };
    for (auto it = lora_freeing.begin(); it != lora_freeing.end();) {
      if (uses(running, *it) || uses(local_waiting, *it) || uses(waiting, *it)) {
        ++it;
      } else {
        frees.push_back(*it);
        it = lora_freeing.erase(it);
      }
    }
  }
  if (n_loads == 0 && frees.empty()) return;
  for (int id : frees) {
    if (runner) runner->RemoveLora(id);
    if (cuda) cuda->RemoveLora(id);
  }
  // Tensor parallelism: the followers free the same ids and read the same loads; a load is
  // installed where every rank could read it, and nowhere else (step_message.h).
  std::vector<int> failures(n_loads, 0);
  absl::Status tp_error;
  if (tp != nullptr) {
    StepMessage m;
    m.kind = StepMessage::Kind::kLora;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (size_t i = 0; i < n_loads; ++i)
        m.lora_loads.push_back({lora_installs[i]->info.name, lora_installs[i]->info.path});
    }
    m.lora_frees = frees;
    tp_error = TpSend(m);
    if (tp_error.ok() && n_loads > 0) {
      absl::StatusOr<std::vector<int>> agreed =
          AgreeOnLoraLoads(tp, std::vector<bool>(n_loads, false));
      if (agreed.ok()) {
        failures = *agreed;
      } else {
        tp_error = agreed.status();
        TpFail(tp_error);
      }
    }
  }
  // Installed and listed under one hold of the lock, so that a load of the same name checking
  // both lists meanwhile sees it in one of them.
  std::lock_guard<std::mutex> lock(mu);
  for (size_t i = 0; i < n_loads; ++i) {
    LoraInstall& op = *lora_installs[i];
    absl::StatusOr<int> id;
    if (!tp_error.ok()) {
      id = absl::UnavailableError(
          absl::StrCat("tensor-parallel group failed (", tp_error.message(), ")"));
    } else if (failures[i] > 0) {
      id = absl::FailedPreconditionError(absl::StrCat(
          "lora_path: ", failures[i], " of the other ", tp->world_size() - 1,
          " tensor-parallel ranks could not load '", op.info.path, "' (their logs say why)"));
    } else {
      id = runner ? runner->InstallLora(std::move(op.weights)) : cuda->InstallLora(op.cuda_weights);
    }
    if (id.ok()) {
      lora_unloaded_at.erase(op.info.name);
      loras.push_back(std::move(op.info));
    }
    op.id.set_value(std::move(id));
  }
  lora_installs.erase(lora_installs.begin(), lora_installs.begin() + n_loads);
}

absl::Status Engine::Impl::TpSend(const StepMessage& m) {
  if (TpFailed()) {
    std::lock_guard<std::mutex> lock(mu);
    return tp_status;
  }
  absl::Status s = SendStepMessage(tp, m);
  if (s.ok() && m.kind == StepMessage::Kind::kHeartbeat) s = tp->Barrier();
  tp_last_send = NowSeconds();
  if (!s.ok()) TpFail(s);
  return s;
}

void Engine::Impl::TpFail(const absl::Status& s) {
  std::lock_guard<std::mutex> lock(mu);
  if (!tp_status.ok()) return;
  tp_status = absl::UnavailableError(
      absl::StrCat("tensor-parallel group failed (", s.ToString(), ")"));
  TS_LOG(ERROR) << tp_status;
}

bool Engine::Impl::TpFailed() const {
  if (tp == nullptr) return false;
  std::lock_guard<std::mutex> lock(mu);
  return !tp_status.ok();
}

void Engine::Impl::TpHeartbeat() {
  StepMessage m;
  m.kind = StepMessage::Kind::kHeartbeat;
  m.finished.swap(tp_finished);
  (void)TpSend(m);
}

void Engine::Impl::TpShutdown() {
  if (tp == nullptr || tp_shutdown_sent || TpFailed()) return;
  tp_shutdown_sent = true;
  StepMessage m;
  m.kind = StepMessage::Kind::kShutdown;
  (void)TpSend(m);
}

// ---------------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  if (options.page_size < 1 || options.page_size > 1024)
    return absl::InvalidArgumentError(
        absl::StrCat("page_size must be in [1, 1024], got ", options.page_size));
  if (options.threads < 1 || options.threads > 256)
    return absl::InvalidArgumentError(absl::StrCat("threads must be in [1, 256], got ", options.threads));
  if (options.max_batch < 1) return absl::InvalidArgumentError("max_batch must be >= 1");
  if (options.max_queue < 0) return absl::InvalidArgumentError("max_queue must be >= 0");
  KvDtype kv_dtype;
  if (!ParseKvDtype(options.kv_dtype, &kv_dtype))
    return absl::InvalidArgumentError(
        absl::StrCat("kv_dtype must be f16 or int8, got '", options.kv_dtype, "'"));
  // The followers build their caches from TpHello, which carries no dtype.
  if (kv_dtype != KvDtype::kF16 && options.tp_size != 1)
    return absl::InvalidArgumentError("kv_dtype int8 is not supported with tensor parallelism");
  if (options.spec_tokens < 0 || options.spec_tokens > 32)
    return absl::InvalidArgumentError(
        absl::StrCat("spec_tokens must be in [0, 32], got ", options.spec_tokens));
  if (options.spec_tokens > 0) {
    if (options.spec_ngram_min < 1 || options.spec_ngram_max < options.spec_ngram_min)
      return absl::InvalidArgumentError(
          absl::StrCat("spec_ngram_min and spec_ngram_max must satisfy 1 <= min <= max, got ",
                       options.spec_ngram_min, " and ", options.spec_ngram_max));
    if (options.device != "cpu" || options.tp_size != 1)
      return absl::InvalidArgumentError(
          "spec_tokens: speculative decoding runs on the CPU runner with one rank for now");
  }
  TS_ASSIGN_OR_RETURN(impl->source, OpenWeightSource(options.model_path));
  TS_ASSIGN_OR_RETURN(impl->source, WithRopeScaling(std::move(impl->source), options.rope_scaling));
  TokenizerData tok_data = impl->source->tokenizer_data();
  if (!options.chat_template.empty()) {
    tok_data.chat_template = options.chat_template;
    if (absl::Status s = CheckChatTemplate(tok_data); !s.ok())
      return absl::InvalidArgumentError(absl::StrCat("--chat-template: ", s.message()));
  }
  TS_ASSIGN_OR_RETURN(impl->tok, Tokenizer::Create(std::move(tok_data)));
  impl->token_table = MakeTokenTable(*impl->tok);
  for (int32_t id = 0; id < impl->tok->vocab_size(); ++id) {
    if (impl->token_table->kind[id] == TokenTable::kEnd) impl->eog_ids.push_back(id);
  }
  impl->think_close_ids = ForcedTokens(*impl->tok, "\n</think>");
  impl->pool = std::make_unique<ThreadPool>(options.threads);
  const ModelConfig& mc = impl->source->config();
  impl->served_name = !options.served_model_name.empty() ? options.served_model_name
                      : !mc.name.empty()                 ? mc.name
                                                         : options.model_path;
  impl->max_context = options.max_context > 0 ? std::min(options.max_context, mc.max_context)
                                              : mc.max_context;
  if (options.tp_size != 1) {
    Communicator* c = options.tp_comm;
    if (c == nullptr || c->world_size() != options.tp_size || c->rank() != options.tp_rank)
      return absl::InvalidArgumentError(absl::StrCat(
          "tp_size ", options.tp_size, " needs tp_comm, a communicator of that size and rank"));
    if (options.tp_rank != 0)
      return absl::InvalidArgumentError(
          "the engine is rank 0 of a tensor-parallel group; ranks > 0 run worker/tp/tp_follower");
    if (!(options.tp_heartbeat_seconds > 0))
      return absl::InvalidArgumentError("tp_heartbeat_seconds must be > 0");
    impl->tp = c;
  }
  int64_t n_pages = options.kv_pages;
  int64_t kv_bytes = 0;
  if (options.device == "cuda") {
    if (options.tp_size != 1)
      return absl::InvalidArgumentError("device cuda: tensor parallelism is CPU-only for now");
    if (kv_dtype != KvDtype::kF16)
      return absl::InvalidArgumentError("device cuda: kv_dtype must be f16");
    TS_RETURN_IF_ERROR(ValidateCudaSelection(options.default_selection));
    const int64_t per_page = CudaRunner::KvBytesPerPage(mc, options.page_size);
    if (n_pages <= 0)
      n_pages = std::max<int64_t>(1, options.kv_memory_mb * (1LL << 20) / std::max<int64_t>(1, per_page));
    CudaRunnerOptions co;
    co.page_size = options.page_size;
    co.num_pages = n_pages;
    co.max_batch = options.max_batch;
    co.max_tokens = std::max(options.max_step_tokens, options.max_batch);
    // Page tables cover what the pool can hold (the context is capped to it below).
    co.max_context =
        static_cast<int>(std::min<int64_t>(impl->max_context, n_pages * options.page_size));
    co.device_pages = options.cuda_device_pages;
    co.resident_layers = options.default_selection.dense_layers;
    co.cuda_graphs = options.cuda_graphs;
    TS_ASSIGN_OR_RETURN(impl->cuda, CudaRunner::Create(*impl->source, co));
    CudaRunner* cuda = impl->cuda.get();
    TS_ASSIGN_OR_RETURN(impl->loras, AddLoras(options.loras, mc, [cuda](const LoraAdapter& a) {
                          return cuda->AddLora(a);
                        }));
    kv_bytes = per_page * n_pages;
  } else if (options.device == "cpu") {
    RunnerOptions ro;
    ro.rank = options.tp_rank;
    ro.world_size = options.tp_size;
    ro.comm = impl->tp;
    ro.pool = impl->pool.get();
    ro.max_positions = impl->max_context;
    TS_ASSIGN_OR_RETURN(impl->runner, TransformerRunner::Create(*impl->source, ro));
    TS_ASSIGN_OR_RETURN(impl->loras, AddLoras(options.loras, impl->runner.get()));
    KvCacheConfig probe = impl->runner->MakeKvConfig(options.page_size, 1);
    probe.dtype = kv_dtype;
    if (n_pages <= 0)
      n_pages = std::max<int64_t>(1, options.kv_memory_mb * (1LL << 20) /
                                         PagedKvCache::BytesForPages(probe, 1));
    KvCacheConfig kv_config = impl->runner->MakeKvConfig(options.page_size, n_pages);
    kv_config.dtype = kv_dtype;
    // int8: each running sequence fills at most one page at a time.
    kv_config.max_staged_pages = 2 * options.max_batch;
    impl->kv = std::make_unique<PagedKvCache>(kv_config);
    kv_bytes = PagedKvCache::BytesForPages(kv_config, n_pages);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("device must be cpu or cuda, got '", options.device, "'"));
  }
  for (const LoraInfo& l : impl->loras)
    if (l.name == impl->served_name)
      return absl::InvalidArgumentError(absl::StrCat(
          "--lora: adapter name '", l.name, "' is the served model's name (pick another)"));
  // A sequence that outgrows the whole pool could only preempt itself and start over, forever:
  // the context is at most what the pool holds (llama.cpp's n_ctx is its KV size too).
  if (const int64_t pool_tokens = n_pages * options.page_size; pool_tokens < impl->max_context) {
    TS_LOG(WARNING) << "the KV pool holds " << pool_tokens << " tokens (" << n_pages << " pages of "
                    << options.page_size << "): the context is " << pool_tokens << " tokens, not "
                    << impl->max_context;
    impl->max_context = static_cast<int>(pool_tokens);
  }
  impl->pages = std::make_unique<PagePool>(n_pages, options.page_size);
  TS_RETURN_IF_ERROR(ValidateSelectionSpec(options.default_selection, options.page_size));
  if (impl->tp != nullptr) {
    // Tell the followers the KV geometry, then wait until every rank has its cache.
    TpHello hello;
    hello.page_size = options.page_size;
    hello.max_context = impl->max_context;
    hello.kv_pages = n_pages;
    hello.n_layers = mc.n_layers;
    hello.vocab_size = mc.vocab_size;
    hello.n_loras = static_cast<int32_t>(impl->loras.size());
    hello.lora_digest = LoraDigest(impl->loras);
    TS_RETURN_IF_ERROR(BroadcastHello(impl->tp, &hello));
    TS_RETURN_IF_ERROR(impl->tp->Barrier());
    impl->tp->StartupDone();
    impl->tp_last_send = NowSeconds();
  }
  impl->PublishStats();
  TS_LOG(INFO) << "loaded " << impl->source->Describe() << ": " << ArchName(mc) << ", "
               << mc.n_layers << " layers, dim " << mc.dim << ", " << mc.n_heads << "/"
               << mc.n_kv_heads << " heads, vocab " << mc.vocab_size << "; KV " << n_pages
               << " pages of " << options.page_size << " tokens, " << KvDtypeName(kv_dtype) << " ("
               << kv_bytes / (1 << 20) << " MiB) on " << options.device
               << (options.device == "cpu"
                       ? " (kernels: " + std::string(CpuIsaName(ActiveCpuIsa())) + ")"
                       : std::string());
  if (absl::Status s = CheckChatTemplate(impl->tok->data()); !s.ok()) {
    TS_LOG(WARNING) << s.message() << "; chat prompts are rendered as plain ChatML";
  }
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

std::vector<int32_t> ForcedTokens(const Tokenizer& tok, std::string_view text) {
  auto bytes_of = [&](const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t id : ids) s += tok.TokenBytes(id);
    return s;
  };
  std::vector<int32_t> ids = tok.Encode(text, /*parse_special=*/true, /*add_bos=*/false);
  if (bytes_of(ids) == text) return ids;
  // A SentencePiece vocabulary puts a space before the text: encode it after a word, and keep
  // what follows the word's own tokens.
  const std::vector<int32_t> word = tok.Encode("x", false, false);
  std::vector<int32_t> after = tok.Encode("x" + std::string(text), true, false);
  if (after.size() > word.size() && std::equal(word.begin(), word.end(), after.begin())) {
    after.erase(after.begin(), after.begin() + static_cast<ptrdiff_t>(word.size()));
    if (bytes_of(after) == text) return after;
  }
  return ids;
}

std::shared_ptr<const TokenTable> MakeTokenTable(const Tokenizer& tok) {
  auto table = std::make_shared<TokenTable>();
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    table->bytes.push_back(tok.TokenBytes(id));
    table->kind.push_back(tok.IsEog(id)       ? TokenTable::kEnd
                          : tok.IsSpecial(id) ? TokenTable::kSpecial
                                              : TokenTable::kNormal);
  }
  table->Index();
  return table;
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() { Stop(); }

absl::Status Engine::Submit(GenerateRequest request, std::shared_ptr<RequestSink> sink) {
  Impl& m = *impl_;
  TS_RETURN_IF_ERROR(m.Validate(request));
  // An adapter's K/V differ from the base model's: its prompt pages get their own hash chain.
  if (request.lora != 0) {
    const int32_t tag[2] = {-1, request.lora};
    request.cache_salt = PagePool::BlockHash(request.cache_salt, tag, 2);
  }
  auto s = std::make_unique<Sequence>();
  s->arrival = NowSeconds();
  s->prompt_len = static_cast<int>(request.prompt_ids.size());
  s->tokens = request.prompt_ids;
  if (request.pooling != Pooling::kNone) s->pooled.assign(m.model().dim, 0.0f);
  s->internal = request.internal;
  SamplingParams sp = request.sampling;
  if (!sp.has_seed) sp.seed = std::hash<std::string>()(request.request_id) ^ 0x5eedULL;
  s->sampler = std::make_unique<Sampler>(sp, sp.ignore_eos ? std::vector<int32_t>() : m.eog_ids);
  std::unique_ptr<TokenConstraint> constraint;
  if (sp.response_format == "json_object") {
    constraint = std::make_unique<JsonObjectConstraint>(
        m.token_table, JsonRecognizer(/*object_only=*/true, /*trailing_space=*/false));
  } else if (sp.response_format == "json_schema") {
    TS_ASSIGN_OR_RETURN(std::shared_ptr<const JsonSchema> schema,
                        JsonSchema::Compile(sp.json_schema));
    s->json_schema = schema;  // the recognizer points into it
    constraint = std::make_unique<RecognizerConstraint<SchemaRecognizer>>(
        m.token_table, SchemaRecognizer(schema.get()));
  } else if (sp.response_format == "regex") {
    auto re = Regex::Compile(sp.regex);
    if (!re.ok()) return absl::InvalidArgumentError(absl::StrCat("regex: ", re.status().message()));
    s->regex = *re;  // the recognizer points into it
    constraint = std::make_unique<RecognizerConstraint<RegexRecognizer>>(
        m.token_table, RegexRecognizer(s->regex.get()));
  } else if (sp.response_format == "grammar") {
    auto g = Grammar::Compile(sp.grammar);
    if (!g.ok()) return absl::InvalidArgumentError(absl::StrCat("grammar: ", g.status().message()));
    constraint = std::make_unique<GrammarConstraint>(m.token_table, *std::move(g),
                                                     m.opts.grammar_mask_budget);
  }
  if (!sp.reasoning_format.empty()) {
    // A reasoning model: the constraint holds the answer after its <think> block, wherever
    // the prompt left it.
    constraint = std::make_unique<ReasoningConstraint>(
        m.token_table,
        ReasoningConstraint::StartOfPrompt(*m.token_table, request.prompt_ids, sp.reasoning_format),
        sp.thinking_token_budget, m.think_close_ids, std::move(constraint));
  }
  if (constraint != nullptr) s->sampler->SetConstraint(std::move(constraint));
  const SelectionSpec spec = request.selection ? *request.selection : m.opts.default_selection;
  const PolicyContext ctx = MakePolicyContext(
      m.model(), m.runner ? m.runner->local_kv_heads() : m.model().n_kv_heads, m.opts.page_size,
      m.kv ? m.kv->dtype() : KvDtype::kF16, sp.seed);
  TS_ASSIGN_OR_RETURN(s->policy, CreatePolicy(spec, ctx));
  s->uid = m.next_uid++;
  s->spec = spec;
  s->policy_seed = ctx.seed;
  s->req = std::move(request);
  // A migrated request: its streamed output goes into the context and through the text
  // pipeline (held-back stop-string prefixes, UTF-8) and the constraint, unsent.
  for (int32_t id : s->req.continuation_ids) {
    s->tokens.push_back(id);
    s->generated++;
    s->sampler->Replay(id);
    std::string unsent;
    if (m.TakeText(*s, id, &unsent)) {
      return absl::InvalidArgumentError("continuation: it already ends the request");
    }
  }
  s->sink = std::move(sink);
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if ((m.draining && !s->req.continues_call) || m.stop)
      return absl::UnavailableError("the worker is draining");
    if (s->req.lora < 0 || s->req.lora > static_cast<int>(m.loras.size()) ||
        (s->req.lora > 0 && m.loras[s->req.lora - 1].name.empty()))
      return absl::InvalidArgumentError(
          absl::StrCat("lora_adapter: adapter ", s->req.lora, " is not loaded"));
    if (!m.tp_status.ok()) return m.tp_status;
    // Requests the next step admits into free batch slots are not waiting: a burst to an idle
    // worker fills its batch and then its queue.
    const int free_slots = std::max(0, m.opts.max_batch - m.stats.running);
    if (static_cast<int>(m.waiting.size()) >= m.opts.max_queue + free_slots && !s->internal)
      return absl::ResourceExhaustedError(
          absl::StrCat("queue full: ", m.opts.max_queue, " requests waiting"));
    // Ordered by priority, FIFO within one (a plain push_back when all are equal).
    auto at = m.waiting.end();
    while (at != m.waiting.begin() && (*std::prev(at))->req.priority > s->req.priority) --at;
    m.waiting.insert(at, std::move(s));
    ++m.stats.waiting;  // (the preempted ones, the engine thread's, stay counted)
  }
  m.cv.notify_all();
  return absl::OkStatus();
}

bool Engine::Abort(const std::string& request_id) {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.aborts.push_back(request_id);
  }
  m.cv.notify_all();
  return true;
}

void Engine::SetObserver(EngineObserver* observer) { impl_->observer = observer; }

void Engine::Start() {
  if (impl_->thread.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->started = true;
  }
  impl_->thread = std::thread([this] { impl_->Loop(); });
}

void Engine::Drain() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->draining = true;
  impl_->stats.draining = true;
}

void Engine::Stop() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) {
    impl_->thread.join();
  } else {
    // No engine thread: abort what is left here.
    while (impl_->Step()) {
    }
  }
  impl_->FailPendingLoras();
  impl_->TpShutdown();  // tensor parallelism: the followers return
}

void Engine::RunUntilIdle() {
  while (true) {
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      if (impl_->waiting.empty() && impl_->running.empty() && impl_->local_waiting.empty() &&
          impl_->aborts.empty())
        return;
    }
    impl_->Step();
  }
}

EngineStats Engine::Stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

absl::Status Engine::TpStatus() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->tp_status;
}

const ModelConfig& Engine::model_config() const { return impl_->model(); }
const Tokenizer& Engine::tokenizer() const { return *impl_->tok; }
const TokenTable& Engine::token_table() const { return *impl_->token_table; }
const EngineOptions& Engine::options() const { return impl_->opts; }
int Engine::max_context() const { return impl_->max_context; }
const std::string& Engine::served_name() const { return impl_->served_name; }
std::vector<LoraInfo> Engine::loras() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->loras;
}

std::map<std::string, double> Engine::unloaded_loras() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->lora_unloaded_at;
}

absl::StatusOr<int> Engine::LoadLora(const std::string& name, const std::string& path,
                                     double loaded_at) {
  Impl& m = *impl_;
  if (absl::Status s = CheckLoraName(name); !s.ok())
    return absl::InvalidArgumentError(absl::StrCat("lora_name: ", s.message()));
  if (path.empty()) return absl::InvalidArgumentError("lora_path: empty");
  if (name == m.served_name)
    return absl::InvalidArgumentError(
        absl::StrCat("lora_name: '", name, "' is the served model's name (pick another)"));
  if (LoraId(loras(), name) != 0)
    return absl::AlreadyExistsError(absl::StrCat("lora_name: '", name, "' is already loaded"));
  TS_ASSIGN_OR_RETURN(std::unique_ptr<LoraAdapter> a, LoraAdapter::Open(name, path, m.model()));
  auto op = std::make_unique<Impl::LoraInstall>();
  if (m.runner) {
    TS_ASSIGN_OR_RETURN(op->weights, m.runner->PrepareLora(*a));
  } else {
    TS_ASSIGN_OR_RETURN(op->cuda_weights, m.cuda->PrepareLora(*a));
  }
  op->info = {name,
              path,
              a->max_rank(),
              a->alpha(),
              static_cast<int>(a->num_pairs()),
              /*runtime=*/true,
              loaded_at > 0 ? loaded_at : UnixSeconds()};
  std::future<absl::StatusOr<int>> id = op->id.get_future();
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.stop) return absl::UnavailableError("the worker is stopping");
    if (!m.started) return absl::FailedPreconditionError("the engine thread is not running");
    bool in_use = LoraId(m.loras, name) != 0;
    for (const auto& pending : m.lora_installs) in_use = in_use || pending->info.name == name;
    if (in_use)
      return absl::AlreadyExistsError(absl::StrCat("lora_name: '", name, "' is already loaded"));
    m.lora_installs.push_back(std::move(op));
  }
  m.cv.notify_all();
  return id.get();
}

absl::Status Engine::UnloadLora(const std::string& name) {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    const int id = name.empty() ? 0 : LoraId(m.loras, name);
    if (id == 0)
      return absl::NotFoundError(absl::StrCat("lora_name: no adapter named '", name, "'"));
    m.loras[id - 1].name.clear();  // unknown to new requests from now on
    m.lora_unloaded.push_back(id);
    m.lora_unloaded_at[name] = UnixSeconds();
  }
  m.cv.notify_all();
  return absl::OkStatus();
}

namespace {
class ProbeSink : public RequestSink {
 public:
  void OnTokens(const std::vector<GeneratedToken>&, const RequestUsage&) override {}
  void OnFinish(FinishReason reason, const RequestUsage&, absl::Status status) override {
    promise.set_value(reason == FinishReason::kError ? status : absl::OkStatus());
  }
  std::promise<absl::Status> promise;
};
}  // namespace

absl::Status Engine::HealthProbe() {
  auto sink = std::make_shared<ProbeSink>();
  auto fut = sink->promise.get_future();
  GenerateRequest r;
  static std::atomic<int64_t> counter{0};
  r.request_id = absl::StrCat("__probe", counter++);
  r.internal = true;
  r.prompt_ids = {std::max(0, impl_->tok->bos_id())};
  r.sampling.max_tokens = 1;
  r.deadline = NowSeconds() + 10;
  TS_RETURN_IF_ERROR(Submit(std::move(r), sink));
  if (!impl_->thread.joinable()) RunUntilIdle();
  if (fut.wait_for(std::chrono::seconds(10)) != std::future_status::ready)
    return absl::DeadlineExceededError("health probe: no forward within 10 s");
  return fut.get();
}

}  // namespace tinyserve
