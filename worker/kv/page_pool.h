// File: worker/kv/page_pool.h
// Allocation of KV pages: a fixed pool of page ids with reference counts and a prefix cache.
//
// A page holds the K/V of `page_size` consecutive token positions of one sequence, for every
// layer and KV head (the storage is PagedKvCache). A page is FREE (refcount 0, no content),
// IN USE (refcount > 0) or CACHED (refcount 0 but holding a full prompt block registered under
// its chained hash, reusable by a later request with the same prefix until it is reclaimed,
// least recently released first).
//
// Prefix hashes chain over page-aligned token blocks: h_i = H(h_{i-1}, tokens of block i), so
// equal hashes mean equal whole prefixes (up to 64-bit collisions; the token ids are compared
// too, so a collision only costs a miss).
//
// Thread safety: not thread-safe; the engine thread owns it.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

namespace tinyserve {

class PagePool {
 public:
  PagePool(int64_t num_pages, int page_size);

  int64_t num_pages() const { return num_pages_; }
  int page_size() const { return page_size_; }
  // Pages that Allocate can hand out now (free + cached).
  int64_t available() const { return static_cast<int64_t>(free_.size() + lru_.size()); }
  int64_t num_cached() const { return static_cast<int64_t>(lru_.size()); }
  int64_t num_used() const { return num_pages_ - available(); }

  // A page with refcount 1, reclaiming the least recently cached page if no page is free.
  // Returns -1 when none is available.
  int32_t Allocate();
  void Ref(int32_t page);
  // Drops a reference; at 0 the page becomes CACHED if registered, else FREE.
  void Unref(int32_t page);
  int32_t refcount(int32_t page) const { return refcount_[page]; }

  // Chained hash of one block given the previous block's hash (0 for the first block).
  static uint64_t BlockHash(uint64_t prev, const int32_t* tokens, int n);
  // Registers a full page under its chained hash (first writer wins).
  void Register(int32_t page, uint64_t hash, const int32_t* tokens);
  // Looks up a cached or in-use page for the hash whose tokens match; takes a reference.
  // Returns -1 on a miss.
  int32_t Lookup(uint64_t hash, const int32_t* tokens);

 private:
  void Unregister(int32_t page);

  int64_t num_pages_;
  int page_size_;
  std::vector<int32_t> refcount_;
  std::vector<int32_t> free_;
  std::list<int32_t> lru_;  // cached pages, oldest first
  std::vector<std::list<int32_t>::iterator> lru_pos_;
  std::vector<bool> in_lru_;
  std::vector<uint64_t> page_hash_;
  std::vector<bool> registered_;
  std::vector<int32_t> page_tokens_;  // [num_pages][page_size] of registered pages
  std::unordered_map<uint64_t, int32_t> by_hash_;
};

}  // namespace tinyserve
