#include "worker/server/worker_metrics.h"

#include "prometheus/metric_family.h"
#include "worker/server/metric_buckets.h"

namespace tinyserve {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

const std::vector<double>& RatioBuckets() {
  static const std::vector<double> b = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0};
  return b;
}

// Refreshes, then collects the registry: what the exposer scrapes.
class RefreshingCollectable : public prometheus::Collectable {
 public:
  RefreshingCollectable(std::shared_ptr<prometheus::Registry> registry,
                        std::function<void()> refresh)
      : registry_(std::move(registry)), refresh_(std::move(refresh)) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    refresh_();
    return registry_->Collect();
  }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::function<void()> refresh_;
};

}  // namespace

WorkerMetrics::WorkerMetrics(const std::string& version, const std::string& model,
                             const std::string& device, std::function<EngineStats()> stats)
    : registry_(std::make_shared<prometheus::Registry>()), stats_(std::move(stats)) {
  auto& r = *registry_;
  auto& requests = BuildCounter()
                       .Name("tinyserve_requests_total")
                       .Help("Requests finished, by outcome")
                       .Register(r);
  auto outcome = [&](const char* name) { return &requests.Add({{"outcome", name}}); };
  prometheus::Counter* stop = outcome("stop");
  by_reason_[static_cast<int>(FinishReason::kLength)] = outcome("length");
  by_reason_[static_cast<int>(FinishReason::kEos)] = stop;
  by_reason_[static_cast<int>(FinishReason::kStopToken)] = stop;
  by_reason_[static_cast<int>(FinishReason::kStopString)] = stop;
  by_reason_[static_cast<int>(FinishReason::kAbort)] = outcome("abort");
  by_reason_[static_cast<int>(FinishReason::kDeadline)] = outcome("deadline");
  by_reason_[static_cast<int>(FinishReason::kError)] = outcome("error");
  invalid_ = outcome("invalid");
  rejected_ = outcome("rejected");

  auto hist = [&](const char* name, const char* help, const std::vector<double>& buckets) {
    return &BuildHistogram().Name(name).Help(help).Register(r).Add({}, buckets);
  };
  ttft_ = hist("tinyserve_time_to_first_token_seconds", "Arrival to first token",
               LatencyBuckets());
  itl_ = hist("tinyserve_inter_token_latency_seconds",
              "Between consecutive tokens of a request", FineLatencyBuckets());
  e2e_ = hist("tinyserve_e2e_request_latency_seconds", "Arrival to finish", LatencyBuckets());
  queue_ = hist("tinyserve_request_queue_seconds", "Arrival to first scheduled",
                LatencyBuckets());
  prefill_ = hist("tinyserve_request_prefill_seconds", "First scheduled to first token",
                  LatencyBuckets());
  decode_ = hist("tinyserve_request_decode_seconds", "First to last token", LatencyBuckets());

  auto counter = [&](const char* name, const char* help) {
    return &BuildCounter().Name(name).Help(help).Register(r).Add({});
  };
  auto gauge = [&](const char* name, const char* help) {
    return &BuildGauge().Name(name).Help(help).Register(r).Add({});
  };
  prompt_tokens_ = counter("tinyserve_prompt_tokens_total", "Prompt tokens of finished requests");
  generation_tokens_ = counter("tinyserve_generation_tokens_total", "Generated tokens");
  running_ = gauge("tinyserve_requests_running", "Sequences in the running batch");
  waiting_ = gauge("tinyserve_requests_waiting", "Requests queued for admission");
  pages_total_ = gauge("tinyserve_kv_pages_capacity", "KV pages in the pool");
  pages_used_ = gauge("tinyserve_kv_pages_used", "KV pages held by running sequences");
  pages_free_ = gauge("tinyserve_kv_pages_free",
                      "KV pages free (including cached prefix pages that can be reclaimed)");
  usage_ratio_ = gauge("tinyserve_kv_usage_ratio", "KV pages used / total, 0..1");
  preemptions_ = counter("tinyserve_preemptions_total",
                         "Sequences preempted (recompute) when pages ran out");
  prefix_queries_tokens_ = counter("tinyserve_prefix_cache_queries_tokens_total",
                                   "Prompt tokens looked up in the prefix cache");
  prefix_hits_tokens_ = counter("tinyserve_prefix_cache_hits_tokens_total",
                                "Prompt tokens served from cached pages");
  prefix_queries_pages_ = counter("tinyserve_prefix_cache_queries_pages_total",
                                  "Full prompt pages looked up in the prefix cache");
  prefix_hits_pages_ = counter("tinyserve_prefix_cache_hits_pages_total",
                               "Full prompt pages found in the prefix cache");
  tier_hits_ = counter("tinyserve_kv_tier_hits_pages_total",
                       "Tiered KV (cuda): needed pages found in the device page cache");
  tier_misses_ = counter("tinyserve_kv_tier_misses_pages_total",
                         "Tiered KV (cuda): needed pages copied from pinned host memory");
  tier_moved_ = counter("tinyserve_kv_tier_moved_bytes_total",
                        "Tiered KV (cuda): bytes copied host -> device into the page cache");
  tier_direct_ = counter("tinyserve_kv_tier_direct_bytes_total",
                         "Tiered KV (cuda): K/V bytes read from host memory when a step's pages "
                         "exceeded the device cache");
  spec_drafts_ = counter("tinyserve_spec_decode_drafts_total",
                         "Speculative decoding: steps that verified drafted tokens");
  spec_draft_tokens_ = counter("tinyserve_spec_decode_draft_tokens_total",
                               "Speculative decoding: tokens drafted by prompt lookup");
  spec_accepted_ = counter("tinyserve_spec_decode_accepted_tokens_total",
                           "Speculative decoding: drafted tokens the model agreed with");

  sel_steps_ = &BuildCounter()
                    .Name("tinyserve_selection_steps_total")
                    .Help("Decode steps under a selection policy")
                    .Register(r);
  sel_scored_ = &BuildCounter()
                     .Name("tinyserve_selection_pages_scored_total")
                     .Help("Pages scored (layer x KV head x page)")
                     .Register(r);
  sel_selected_ = &BuildCounter()
                       .Name("tinyserve_selection_pages_selected_total")
                       .Help("Pages attended")
                       .Register(r);
  sel_bytes_read_ = &BuildCounter()
                         .Name("tinyserve_selection_kv_bytes_read_total")
                         .Help("KV bytes read by attention (incl. page metadata)")
                         .Register(r);
  sel_bytes_dense_ = &BuildCounter()
                          .Name("tinyserve_selection_kv_bytes_dense_total")
                          .Help("KV bytes dense attention would have read")
                          .Register(r);
  sel_hit_rate_ = &BuildHistogram()
                       .Name("tinyserve_selection_page_hit_rate")
                       .Help("Sampled: share of the oracle's top pages chosen (0..1)")
                       .Register(r);
  sel_recall_ = &BuildHistogram()
                     .Name("tinyserve_selection_mass_recall")
                     .Help("Sampled: dense attention mass inside the chosen tokens (0..1)")
                     .Register(r);

  steps_ = counter("tinyserve_engine_steps_total", "Scheduler steps");
  embedding_inputs_ =
      counter("tinyserve_embedding_inputs_total", "Inputs embedded (Embed calls, /v1/embeddings)");
  step_seconds_ = hist("tinyserve_engine_step_seconds",
                       "One scheduler step (batched forward + sampling)", FineLatencyBuckets());
  ready_ = gauge("tinyserve_worker_ready",
                 "1 when ready (model loaded, watchdog happy, not draining)");
  BuildGauge()
      .Name("tinyserve_build_info")
      .Help("Build and model information; always 1")
      .Register(r)
      .Add({{"version", version}, {"model", model}, {"device", device}})
      .Set(1);

  collectable_ = std::make_shared<RefreshingCollectable>(registry_, [this] { Refresh(); });
}

void WorkerMetrics::Advance(prometheus::Counter* counter, int64_t now, int64_t* last) {
  if (now > *last) counter->Increment(static_cast<double>(now - *last));
  *last = now;
}

void WorkerMetrics::Refresh() {
  if (!stats_) return;
  const EngineStats s = stats_();
  std::lock_guard<std::mutex> lock(refresh_mu_);
  running_->Set(s.running);
  waiting_->Set(s.waiting);
  pages_total_->Set(static_cast<double>(s.kv_pages_total));
  pages_used_->Set(static_cast<double>(s.kv_pages_used));
  pages_free_->Set(static_cast<double>(s.kv_pages_free));
  usage_ratio_->Set(s.kv_pages_total > 0 ? static_cast<double>(s.kv_pages_used) /
                                               static_cast<double>(s.kv_pages_total)
                                         : 0.0);
  Advance(preemptions_, s.preemptions_total, &last_.preemptions);
  Advance(generation_tokens_, s.generated_tokens_total, &last_.generated);
  Advance(prefix_queries_tokens_, s.prefix_queries_tokens, &last_.pq_tokens);
  Advance(prefix_hits_tokens_, s.prefix_hits_tokens, &last_.ph_tokens);
  Advance(prefix_queries_pages_, s.prefix_queries_pages, &last_.pq_pages);
  Advance(prefix_hits_pages_, s.prefix_hits_pages, &last_.ph_pages);
  Advance(tier_hits_, s.kv_tier_hits, &last_.tier_hits);
  Advance(tier_misses_, s.kv_tier_misses, &last_.tier_misses);
  Advance(tier_moved_, s.kv_tier_bytes_moved, &last_.tier_moved);
  Advance(tier_direct_, s.kv_tier_bytes_direct, &last_.tier_direct);
  Advance(spec_drafts_, s.spec_drafts_total, &last_.spec_drafts);
  Advance(spec_draft_tokens_, s.spec_draft_tokens_total, &last_.spec_draft_tokens);
  Advance(spec_accepted_, s.spec_accepted_tokens_total, &last_.spec_accepted);
}

void WorkerMetrics::DeclareLoras(const std::vector<LoraInfo>& loras) {
  for (size_t i = 0; i < loras.size(); ++i) AddLora(static_cast<int>(i) + 1, loras[i].name);
}

void WorkerMetrics::AddLora(int id, const std::string& name) {
  std::lock_guard<std::mutex> lock(lora_mu_);
  if (lora_family_ == nullptr) {
    lora_family_ = &BuildCounter()
                        .Name("tinyserve_lora_requests_total")
                        .Help("Requests admitted with a LoRA adapter, by adapter")
                        .Register(*registry_);
  }
  if (id < 1) return;
  if (lora_requests_.size() < static_cast<size_t>(id)) {
    lora_requests_.resize(id, nullptr);
    lora_names_.resize(id);
  }
  lora_requests_[id - 1] = &lora_family_->Add({{"adapter", name}});
  lora_names_[id - 1] = name;
}

void WorkerMetrics::RemoveLora(const std::string& name) {
  std::lock_guard<std::mutex> lock(lora_mu_);
  for (size_t i = 0; i < lora_requests_.size(); ++i) {
    if (lora_requests_[i] == nullptr || lora_names_[i] != name) continue;
    // (One series per name: a reload under the name shares it until this removal.)
    lora_family_->Remove(lora_requests_[i]);
    for (size_t j = 0; j < lora_requests_.size(); ++j)
      if (lora_names_[j] == name) lora_requests_[j] = nullptr;
    return;
  }
}

void WorkerMetrics::CountLoraRequest(int lora) {
  std::lock_guard<std::mutex> lock(lora_mu_);
  if (lora >= 1 && lora <= static_cast<int>(lora_requests_.size()) && lora_requests_[lora - 1])
    lora_requests_[lora - 1]->Increment();
}

void WorkerMetrics::OnRequestFinished(FinishReason reason, const RequestUsage& usage) {
  const int index = static_cast<int>(reason);
  if (index >= 0 && index < 7) by_reason_[index]->Increment();
  prompt_tokens_->Increment(usage.prompt_tokens);
  e2e_->Observe(usage.e2e_seconds);
  if (usage.generated_tokens > 0) {
    ttft_->Observe(usage.ttft_seconds);
    queue_->Observe(usage.queue_seconds);
    prefill_->Observe(usage.prefill_seconds);
    decode_->Observe(usage.decode_seconds);
  }
}

void WorkerMetrics::OnTokenEmitted(double inter_token_seconds) {
  itl_->Observe(inter_token_seconds);
}

void WorkerMetrics::OnStep(int /*batch_size*/, int /*prefill_tokens*/, double seconds) {
  steps_->Increment();
  step_seconds_->Observe(seconds);
}

WorkerMetrics::PolicySeries& WorkerMetrics::Policy(const std::string& policy) {
  auto it = policies_.find(policy);
  if (it != policies_.end()) return it->second;
  const prometheus::Labels labels = {{"policy", policy}};
  PolicySeries s{&sel_steps_->Add(labels),       &sel_scored_->Add(labels),
                 &sel_selected_->Add(labels),    &sel_bytes_read_->Add(labels),
                 &sel_bytes_dense_->Add(labels), &sel_hit_rate_->Add(labels, RatioBuckets()),
                 &sel_recall_->Add(labels, RatioBuckets())};
  return policies_.emplace(policy, s).first->second;
}

void WorkerMetrics::OnSelectionStep(const SelectionSummary& step) {
  PolicySeries& s = Policy(step.policy.empty() ? "dense" : step.policy);
  s.steps->Increment(step.steps > 0 ? static_cast<double>(step.steps) : 1.0);
  s.scored->Increment(static_cast<double>(step.pages_scored));
  s.selected->Increment(static_cast<double>(step.pages_selected));
  s.bytes_read->Increment(static_cast<double>(step.kv_bytes_read));
  s.bytes_dense->Increment(static_cast<double>(step.kv_bytes_dense));
  if (step.page_hit_rate >= 0) s.hit_rate->Observe(step.page_hit_rate);
  if (step.mass_recall >= 0) s.recall->Observe(step.mass_recall);
}

}  // namespace tinyserve
