#include "router/router_core.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/timer.h"

namespace tinyserve {

std::vector<WorkerPtr> RouterCore::Candidates(const std::vector<WorkerPtr>& exclude,
                                              const std::string& adapter) const {
  std::vector<std::pair<WorkerPtr, bool>> routable;  // (worker, serves the adapter)
  const double now = NowSeconds();
  bool served = false;
  for (const WorkerPtr& w : registry->Snapshot()) {
    if (!w->healthy() || !w->breaker().Available(now)) continue;
    const bool serves = !adapter.empty() && w->ServesAdapter(adapter);
    served = served || serves;
    routable.emplace_back(w, serves);
  }
  std::vector<WorkerPtr> out;
  for (const auto& [w, serves] : routable) {
    if (served && !serves) continue;
    if (std::find(exclude.begin(), exclude.end(), w) != exclude.end()) continue;
    out.push_back(w);
  }
  return out;
}

WorkerPtr RouterCore::AnyHealthy() const {
  WorkerPtr best;
  for (const WorkerPtr& w : Candidates({})) {
    if (best == nullptr || w->inflight() < best->inflight()) best = w;
  }
  return best;
}

std::string RouterCore::NewRequestId() {
  return absl::StrCat("r", getpid(), "-", next_id.fetch_add(1));
}

}  // namespace tinyserve
