// File: worker/kv/paged_kv_cache.h
// Storage of the paged KV cache and its page metadata (the bounding box of each page's keys).
//
// Layout, per layer (one contiguous block each):
//   K, V      [num_pages][n_kv_heads][page_size][head_dim]   fp16
//   kmin,kmax [num_pages][n_kv_heads][head_dim]              fp32
// A page id addresses the same token positions in every layer. Token t of a sequence lives in
// page table[t / page_size], slot t % page_size. Keys are stored after RoPE.
//
// Metadata invariant: for every page, layer and KV head, kmin[d] <= k[d] <= kmax[d] for each
// stored (fp16-rounded) key of the page's valid slots; it is kept by WriteToken (running min/max)
// and reset by ResetPage when a page is (re)allocated. A page shared by several sequences (prefix
// cache) is only written before it is shared, so it shares its metadata too.
//
// Memory overhead of the metadata: 2 * head_dim * 4 bytes per page and KV head against
// 2 * page_size * head_dim * 2 bytes of K+V: 2 / page_size (12.5% at page size 16; 6.25% at 32).
//
// Thread safety: no locking. The engine writes tokens of distinct pages from several threads
// (one writer per page) and attention reads pages that no one writes in that step.
#pragma once

#include <cstdint>
#include <vector>

#include "common/fp16.h"

namespace tinyserve {

struct KvCacheConfig {
  int n_layers = 0;
  int n_kv_heads = 0;  // heads held by this rank
  int head_dim = 0;
  int page_size = 16;
  int64_t num_pages = 0;
};

class PagedKvCache {
 public:
  explicit PagedKvCache(const KvCacheConfig& config);

  const KvCacheConfig& config() const { return config_; }
  // Bytes of K+V per token (all layers and heads of this rank), and of one page.
  int64_t BytesPerToken() const;
  int64_t BytesPerPage() const { return BytesPerToken() * config_.page_size; }
  // Bytes a config of n pages needs (K, V and metadata).
  static int64_t BytesForPages(const KvCacheConfig& config, int64_t n);

  // [page_size][head_dim] blocks of one page, layer and head.
  fp16_t* K(int layer, int32_t page, int head) { return k_[layer].data() + Offset(page, head); }
  fp16_t* V(int layer, int32_t page, int head) { return v_[layer].data() + Offset(page, head); }
  const fp16_t* K(int layer, int32_t page, int head) const {
    return k_[layer].data() + Offset(page, head);
  }
  const fp16_t* V(int layer, int32_t page, int head) const {
    return v_[layer].data() + Offset(page, head);
  }
  // [head_dim] bounds of one page, layer and head.
  const float* KMin(int layer, int32_t page, int head) const {
    return kmin_[layer].data() + MetaOffset(page, head);
  }
  const float* KMax(int layer, int32_t page, int head) const {
    return kmax_[layer].data() + MetaOffset(page, head);
  }

  // Empties the metadata of a page in every layer (min = +inf, max = -inf).
  void ResetPage(int32_t page);
  // Stores one token's keys and values (all local KV heads, [n_kv_heads][head_dim] floats) in
  // a page slot and widens the page's bounding box.
  void WriteToken(int layer, int32_t page, int slot, const float* k, const float* v);
  // Copies a page's contents (all layers) to another page (copy-on-write of a partial page).
  void CopyPage(int32_t src, int32_t dst);

 private:
  size_t Offset(int32_t page, int head) const {
    return (static_cast<size_t>(page) * config_.n_kv_heads + head) * config_.page_size *
           config_.head_dim;
  }
  size_t MetaOffset(int32_t page, int head) const {
    return (static_cast<size_t>(page) * config_.n_kv_heads + head) * config_.head_dim;
  }

  KvCacheConfig config_;
  std::vector<std::vector<fp16_t>> k_, v_;
  std::vector<std::vector<float>> kmin_, kmax_;
};

}  // namespace tinyserve
