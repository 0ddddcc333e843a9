#include "worker/kv/page_pool.h"

#include <algorithm>
#include <cstring>

#include "common/log.h"

namespace tinyserve {

PagePool::PagePool(int64_t num_pages, int page_size)
    : num_pages_(num_pages),
      page_size_(page_size),
      refcount_(num_pages, 0),
      lru_pos_(num_pages),
      in_lru_(num_pages, false),
      page_hash_(num_pages, 0),
      registered_(num_pages, false),
      page_tokens_(static_cast<size_t>(num_pages) * page_size, 0) {
  free_.reserve(num_pages);
  for (int64_t p = num_pages - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
}

int32_t PagePool::Allocate() {
  int32_t page;
  if (!free_.empty()) {
    page = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    page = lru_.front();
    lru_.pop_front();
    in_lru_[page] = false;
    Unregister(page);
  } else {
    return -1;
  }
  TS_CHECK(refcount_[page] == 0) << "page " << page;
  refcount_[page] = 1;
  return page;
}

void PagePool::Ref(int32_t page) {
  TS_CHECK(page >= 0 && page < num_pages_) << page;
  if (refcount_[page] == 0 && in_lru_[page]) {
    lru_.erase(lru_pos_[page]);
    in_lru_[page] = false;
  }
  ++refcount_[page];
}

void PagePool::Unref(int32_t page) {
  TS_CHECK(page >= 0 && page < num_pages_ && refcount_[page] > 0) << "page " << page;
  if (--refcount_[page] > 0) return;
  if (registered_[page]) {
    lru_.push_back(page);
    lru_pos_[page] = std::prev(lru_.end());
    in_lru_[page] = true;
  } else {
    free_.push_back(page);
  }
}

uint64_t PagePool::BlockHash(uint64_t prev, const int32_t* tokens, int n) {
  // FNV-1a over the previous hash and the token ids, then a final avalanche (splitmix64).
  uint64_t h = 1469598103934665603ull ^ prev;
  for (int i = 0; i < n; ++i) {
    uint32_t t = static_cast<uint32_t>(tokens[i]);
    for (int b = 0; b < 4; ++b) {
      h ^= (t >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  h += 0x9e3779b97f4a7c15ull;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

void PagePool::Register(int32_t page, uint64_t hash, const int32_t* tokens) {
  if (registered_[page] || by_hash_.count(hash)) return;
  registered_[page] = true;
  page_hash_[page] = hash;
  std::memcpy(&page_tokens_[static_cast<size_t>(page) * page_size_], tokens,
              sizeof(int32_t) * page_size_);
  by_hash_[hash] = page;
}

void PagePool::Unregister(int32_t page) {
  if (!registered_[page]) return;
  registered_[page] = false;
  auto it = by_hash_.find(page_hash_[page]);
  if (it != by_hash_.end() && it->second == page) by_hash_.erase(it);
}

int32_t PagePool::Lookup(uint64_t hash, const int32_t* tokens) {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return -1;
  const int32_t page = it->second;
  if (std::memcmp(&page_tokens_[static_cast<size_t>(page) * page_size_], tokens,
                  sizeof(int32_t) * page_size_) != 0)
    return -1;
  Ref(page);
  return page;
}

}  // namespace tinyserve
