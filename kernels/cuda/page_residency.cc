#include "kernels/cuda/page_residency.h"

#include <algorithm>

namespace tinyserve::cuda {

PageResidency::PageResidency(int capacity)
    : capacity_(std::max(0, capacity)), page_in_(capacity_, -1), last_used_(capacity_, -1) {}

bool PageResidency::Ensure(const std::vector<int32_t>& needed, std::vector<Copy>* copies) {
  copies->clear();
  std::vector<int32_t> distinct(needed);
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  if (static_cast<int64_t>(distinct.size()) > capacity_) {
    totals_.over_capacity++;
    return false;
  }
  const int64_t now = ++clock_;
  std::vector<int32_t> missing;
  for (int32_t p : distinct) {
    auto it = slot_of_.find(p);
    if (it == slot_of_.end()) {
      missing.push_back(p);
    } else {
      last_used_[it->second] = now;
      totals_.hits++;
    }
  }
  if (missing.empty()) return true;
  // Victims: free slots first, then the least recently needed ones; none is needed now (every
  // resident needed page was stamped `now` above).
  std::vector<int32_t> order;
  order.reserve(capacity_);
  for (int32_t s = 0; s < capacity_; ++s)
    if (last_used_[s] != now) order.push_back(s);
  // Only the first missing.size() victims are needed, in order.
  std::partial_sort(order.begin(), order.begin() + missing.size(), order.end(),
                    [&](int32_t a, int32_t b) {
                      const bool fa = page_in_[a] < 0, fb = page_in_[b] < 0;
                      if (fa != fb) return fa;
                      return last_used_[a] != last_used_[b] ? last_used_[a] < last_used_[b]
                                                            : a < b;
                    });
  for (size_t i = 0; i < missing.size(); ++i) {
    const int32_t s = order[i];  // enough: |distinct| <= capacity
    if (page_in_[s] >= 0) slot_of_.erase(page_in_[s]);
    page_in_[s] = missing[i];
    last_used_[s] = now;
    slot_of_[missing[i]] = s;
    copies->push_back({missing[i], s});
  }
  totals_.misses += static_cast<int64_t>(missing.size());
  return true;
}

int32_t PageResidency::SlotOf(int32_t page) const {
  auto it = slot_of_.find(page);
  return it == slot_of_.end() ? -1 : it->second;
}

void PageResidency::Invalidate(const std::vector<int32_t>& pages) {
  for (int32_t p : pages) {
    auto it = slot_of_.find(p);
    if (it == slot_of_.end()) continue;
    page_in_[it->second] = -1;
    last_used_[it->second] = -1;
    slot_of_.erase(it);
  }
}

}  // namespace tinyserve::cuda
