// File: worker/server/worker_metrics.h
// The worker's Prometheus metrics (names and meanings: docs/METRICS.md, "Worker").
//
// Every family is registered once in the constructor and every series is kept by reference, so
// the hot path (the engine thread, through the EngineObserver methods) only increments and
// observes. Gauges that mirror engine state (running, waiting, KV pages) and counters kept by
// the engine (preemptions, prefix-cache counters, generated tokens) are refreshed from
// Engine::Stats() just before each scrape, through the Collectable this class hands to the
// exposer, so a scrape always sees current values.
//
// Threading: the observer methods run on the engine thread; CountRejected/CountInvalid on RPC
// threads; Collect on the exposer's thread. prometheus-cpp series are thread-safe; the
// per-policy map is only touched by the engine thread; the refresh holds its own mutex.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "worker/engine/engine.h"

namespace tinyserve {

class WorkerMetrics : public EngineObserver {
 public:
  // stats: how to read the engine's current counters (called before each scrape).
  WorkerMetrics(const std::string& version, const std::string& model, const std::string& device,
                std::function<EngineStats()> stats);

  // What the exposer serves: refreshes the mirrored values, then collects the registry.
  std::shared_ptr<prometheus::Collectable> collectable() { return collectable_; }
  // Where other parts of the process (the HTTP frontend) register their families.
  prometheus::Registry* registry() { return registry_.get(); }

  // Admission failures counted by the RPC layer (the engine never saw these requests).
  void CountInvalid() { invalid_->Increment(); }
  void CountRejected() { rejected_->Increment(); }
  // A request refused before the engine took it: rejected (RESOURCE_EXHAUSTED, UNAVAILABLE),
  // else invalid.
  void CountRefusal(absl::StatusCode code) {
    if (code == absl::StatusCode::kResourceExhausted || code == absl::StatusCode::kUnavailable) {
      CountRejected();
    } else {
      CountInvalid();
    }
  }
  // An Embed call's input embedded (each is also a finished request, outcome "length").
  void CountEmbedding() { embedding_inputs_->Increment(); }
  void SetReady(bool ready) { ready_->Set(ready ? 1 : 0); }
  // LoRA adapters: one tinyserve_lora_requests_total{adapter} series each, by id (those given
  // at start, and each loaded at run time: AddLora), and a count per request admitted with
  // adapter id `lora` (1-based). An unloaded adapter's series goes (RemoveLora), so loading
  // and unloading many names does not grow /metrics without end.
  void DeclareLoras(const std::vector<LoraInfo>& loras);
  void AddLora(int id, const std::string& name);
  void RemoveLora(const std::string& name);
  void CountLoraRequest(int lora);

  // EngineObserver (engine thread).
  void OnRequestFinished(FinishReason reason, const RequestUsage& usage) override;
  void OnTokenEmitted(double inter_token_seconds) override;
  void OnStep(int batch_size, int prefill_tokens, double seconds) override;
  void OnSelectionStep(const SelectionSummary& step) override;

  // Mirrors Engine::Stats() into gauges and counters (also called by Collect).
  void Refresh();

 private:
  struct PolicySeries {
    prometheus::Counter* steps;
    prometheus::Counter* scored;
    prometheus::Counter* selected;
    prometheus::Counter* bytes_read;
    prometheus::Counter* bytes_dense;
    prometheus::Histogram* hit_rate;
    prometheus::Histogram* recall;
  };
  PolicySeries& Policy(const std::string& policy);
  // Increments counter by (now - *last) when positive and remembers now.
  static void Advance(prometheus::Counter* counter, int64_t now, int64_t* last);

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<prometheus::Collectable> collectable_;
  std::function<EngineStats()> stats_;

  prometheus::Counter* by_reason_[7];  // indexed by FinishReason
  prometheus::Counter* invalid_;
  prometheus::Counter* rejected_;
  prometheus::Counter* embedding_inputs_;
  std::mutex lora_mu_;
  prometheus::Family<prometheus::Counter>* lora_family_ = nullptr;  // GUARDED_BY(lora_mu_)
  std::vector<prometheus::Counter*> lora_requests_;  // GUARDED_BY(lora_mu_) [adapter id - 1]
  std::vector<std::string> lora_names_;              // GUARDED_BY(lora_mu_) [adapter id - 1]
  prometheus::Histogram* ttft_;
  prometheus::Histogram* itl_;
  prometheus::Histogram* e2e_;
  prometheus::Histogram* queue_;
  prometheus::Histogram* prefill_;
  prometheus::Histogram* decode_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* generation_tokens_;
  prometheus::Gauge* running_;
  prometheus::Gauge* waiting_;
  prometheus::Gauge* pages_total_;
  prometheus::Gauge* pages_used_;
  prometheus::Gauge* pages_free_;
  prometheus::Gauge* usage_ratio_;
  prometheus::Counter* preemptions_;
  prometheus::Counter* prefix_queries_tokens_;
  prometheus::Counter* prefix_hits_tokens_;
  prometheus::Counter* prefix_queries_pages_;
  prometheus::Counter* prefix_hits_pages_;
  prometheus::Counter *tier_hits_, *tier_misses_, *tier_moved_, *tier_direct_;
  prometheus::Counter *spec_drafts_, *spec_draft_tokens_, *spec_accepted_;
  prometheus::Counter* steps_;
  prometheus::Histogram* step_seconds_;
  prometheus::Gauge* ready_;

  prometheus::Family<prometheus::Counter>* sel_steps_;
  prometheus::Family<prometheus::Counter>* sel_scored_;
  prometheus::Family<prometheus::Counter>* sel_selected_;
  prometheus::Family<prometheus::Counter>* sel_bytes_read_;
  prometheus::Family<prometheus::Counter>* sel_bytes_dense_;
  prometheus::Family<prometheus::Histogram>* sel_hit_rate_;
  prometheus::Family<prometheus::Histogram>* sel_recall_;
  std::map<std::string, PolicySeries> policies_;  // engine thread only

  std::mutex refresh_mu_;
  struct Last {
    int64_t preemptions = 0, generated = 0, pq_tokens = 0, ph_tokens = 0, pq_pages = 0,
            ph_pages = 0, tier_hits = 0, tier_misses = 0, tier_moved = 0, tier_direct = 0,
            spec_drafts = 0, spec_draft_tokens = 0, spec_accepted = 0;
  } last_;  // GUARDED_BY(refresh_mu_)
};

}  // namespace tinyserve
