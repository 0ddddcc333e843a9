#include "worker/server/prefix_lru.h"

namespace tinyserve {

void PrefixLru::Insert(const std::vector<uint64_t>& hashes) {
  std::lock_guard<std::mutex> lock(mu_);
  // Insert in reverse so that the chain's first block ends up most recent: a prefix is useful
  // only together with its parents, so parents must outlive their children.
  for (auto it = hashes.rbegin(); it != hashes.rend(); ++it) {
    auto found = index_.find(*it);
    if (found != index_.end()) order_.erase(found->second);
    order_.push_front(*it);
    index_[*it] = order_.begin();
  }
  while (order_.size() > capacity_) {
    index_.erase(order_.back());
    order_.pop_back();
  }
}

size_t PrefixLru::MatchLength(const std::vector<uint64_t>& hashes) const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  while (n < hashes.size() && index_.count(hashes[n]) > 0) ++n;
  return n;
}

std::vector<uint64_t> PrefixLru::Snapshot(size_t max) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint64_t> out;
  for (uint64_t h : order_) {
    if (max > 0 && out.size() >= max) break;
    out.push_back(h);
  }
  return out;
}

void PrefixLru::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  order_.clear();
  index_.clear();
}

size_t PrefixLru::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return order_.size();
}

}  // namespace tinyserve
