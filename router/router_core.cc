#include "router/router_core.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/timer.h"

namespace tinyserve {

std::vector<WorkerPtr> RouterCore::Candidates(const std::vector<WorkerPtr>& exclude) const {
  std::vector<WorkerPtr> out;
  const double now = NowSeconds();
  for (const WorkerPtr& w : registry->Snapshot()) {
    if (!w->healthy() || !w->breaker().Available(now)) continue;
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
