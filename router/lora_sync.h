// File: router/lora_sync.h
// Keeps the LoRA adapters loaded at run time the same on every healthy worker.
//
// Load/UnloadLoraAdapter through the router reach the workers healthy at that moment. A worker
// that joins later (scaled out, or restarted: run-time adapters live in its memory only) or was
// unreachable then is brought in line here, after each health-poll round. Each worker reports
// (GetLoad) its run-time adapters with the Unix time of their load and the names it unloaded
// with the time of the unload; per name, the latest of these events over the healthy workers
// is what every one of them should have:
//   a load     a worker that does not serve the name gets LoadLoraAdapter(name, path,
//              loaded_at = that load's time), so the copy is no newer than the event it copies;
//   an unload  a worker that still has it from an earlier run-time load gets UnloadLoraAdapter.
// The state lives in the workers, so any number of router replicas (or a restarted router)
// reach the same decisions; a report a round old only causes a call that is undone a round
// later. Adapters given with --lora are never loaded or unloaded here. Hosts' clocks are assumed
// to agree to well under the time between an operator's load and unload of one name.
// One call per worker at a time; a refused one (the worker lacks --allow-runtime-lora, or the
// file is not on its host) is logged once and retried every `retry_seconds`.
//
// Threading: Reconcile runs on the registry's poller thread; call completions run on gRPC
// threads. The destructor cancels calls still out and detaches them from the metrics.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "router/router_metrics.h"
#include "router/worker_registry.h"

namespace tinyserve {

class LoraSync {
 public:
  // metrics: tinyserve_router_lora_syncs_total (may be null).
  explicit LoraSync(RouterMetrics* metrics, double retry_seconds = 10);
  ~LoraSync();

  // After a health-poll round: starts the calls that bring healthy workers in line.
  void Reconcile(const std::vector<WorkerPtr>& workers);

 private:
  struct Shared;
  std::shared_ptr<Shared> shared_;
};

}  // namespace tinyserve
