// File: worker/server/prefix_lru.h
// A bounded set of prompt block hashes (worker/server/block_hash.h), least recently used
// evicted first. The worker records what it served (for GetPrefixSummary); the router keeps
// one per worker as its approximate prefix index.
//
// Threading: all methods are thread-safe (one mutex).
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace tinyserve {

class PrefixLru {
 public:
  explicit PrefixLru(size_t capacity) : capacity_(capacity) {}

  // Inserts (or refreshes) the hashes; the first ones become the most recently used.
  void Insert(const std::vector<uint64_t>& hashes);
  // How many leading hashes of a prompt's chain are present (its matched prefix, in blocks).
  size_t MatchLength(const std::vector<uint64_t>& hashes) const;
  // Up to max hashes, most recently used first (0: all).
  std::vector<uint64_t> Snapshot(size_t max) const;
  void Clear();
  size_t size() const;

 private:
  size_t capacity_;
  mutable std::mutex mu_;
  std::list<uint64_t> order_;  // most recent first; GUARDED_BY(mu_)
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> index_;  // GUARDED_BY(mu_)
};

}  // namespace tinyserve
