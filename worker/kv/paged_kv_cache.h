// File: worker/kv/paged_kv_cache.h
// Storage of the paged KV cache and its page metadata (the bounding box of each page's keys).
//
// Layout, per layer (one contiguous block each):
//   K, V      [num_pages][n_kv_heads][page_size][head_dim]   fp16, or int8 with KvDtype::kInt8
//   kmin,kmax [num_pages][n_kv_heads][head_dim]              fp32
//   kscale    [num_pages][n_kv_heads][head_dim]              fp32 (int8 only)
//   vscale    [num_pages][n_kv_heads]                        fp32 (int8 only)
// A page id addresses the same token positions in every layer. Token t of a sequence lives in
// page table[t / page_size], slot t % page_size. Keys are stored after RoPE.
//
// Metadata invariant: for every page, layer and KV head, kmin[d] <= k[d] <= kmax[d] for each
// stored (fp16-rounded) key of the page's valid slots; it is kept by WriteToken (running min/max)
// and reset by ResetPage when a page is (re)allocated. A page shared by several sequences (prefix
// cache) is only written before it is shared, so it shares its metadata too.
//
// int8 storage: a stored value is q * scale with q in [-127, 127]; scales are per page, layer
// and KV head: for K one per channel (keys after RoPE have channels of very different
// magnitude), for V one for the whole block.
// A scale is 0 until its page holds a nonzero value. When a new token does not fit a scale
// (|x| > 127 * scale) the values under it are re-quantized to the larger scale,
// q' = round(q * old / new), and the box with them (rounding is monotone, so the box of the
// re-quantized keys is the re-quantized box). The box bounds the dequantized keys
// q * scale, computed in fp32 exactly as attention computes them. Error per element: at most
// scale / 2 for a value written at the page's current scale; each later re-quantization adds at
// most new_scale / 2 (pages grow their scale a few times at most: the first tokens of a page
// usually set it).
//
// Memory overhead of the metadata: 2 * head_dim * 4 bytes per page and KV head against
// 2 * page_size * head_dim * 2 bytes of K+V: 2 / page_size (12.5% at page size 16; 6.25% at 32).
// int8 K+V take half the bytes of fp16; their scales add (head_dim + 1) * 4 bytes per page and
// KV head (page size 16, head_dim 64: int8 K+V+scales+box = 61.2% of fp16 K+V+box).
// Accuracy, measured in docs/PERFORMANCE.md "int8 KV cache" (SmolLM2, 128 tokens): perplexity
// +0.98% at context 2K, -0.67% at 4K; one scale per block for K instead was +0.79% and +2.1%.
//
// Thread safety: no locking. The engine writes tokens of distinct pages from several threads
// (one writer per page) and attention reads pages that no one writes in that step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/fp16.h"

namespace tinyserve {

enum class KvDtype { kF16, kInt8 };

// Bytes of one stored K or V element.
inline int KvDtypeBytes(KvDtype d) { return d == KvDtype::kInt8 ? 1 : 2; }
// "f16" / "int8".
const char* KvDtypeName(KvDtype d);
// Parses "f16" (also "fp16") or "int8"; false when the name is unknown.
bool ParseKvDtype(const std::string& name, KvDtype* out);

struct KvCacheConfig {
  int n_layers = 0;
  int n_kv_heads = 0;  // heads held by this rank
  int head_dim = 0;
  int page_size = 16;
  int64_t num_pages = 0;
  KvDtype dtype = KvDtype::kF16;
};

class PagedKvCache {
 public:
  explicit PagedKvCache(const KvCacheConfig& config);

  const KvCacheConfig& config() const { return config_; }
  // Bytes of K+V elements per token (all layers and heads of this rank), and of one page
  // (without the per-page scales and box).
  int64_t BytesPerToken() const;
  int64_t BytesPerPage() const { return BytesPerToken() * config_.page_size; }
  // Bytes a config of n pages needs (K, V, int8 scales and the box metadata).
  static int64_t BytesForPages(const KvCacheConfig& config, int64_t n);

  KvDtype dtype() const { return config_.dtype; }

  // [page_size][head_dim] blocks of one page, layer and head. REQUIRES: dtype() == kF16.
  fp16_t* K(int layer, int32_t page, int head) { return k_[layer].data() + Offset(page, head); }
  fp16_t* V(int layer, int32_t page, int head) { return v_[layer].data() + Offset(page, head); }
  const fp16_t* K(int layer, int32_t page, int head) const {
    return k_[layer].data() + Offset(page, head);
  }
  const fp16_t* V(int layer, int32_t page, int head) const {
    return v_[layer].data() + Offset(page, head);
  }
  // int8 blocks [page_size][head_dim] and their scales (value = q * scale).
  // REQUIRES: dtype() == kInt8.
  const int8_t* K8(int layer, int32_t page, int head) const {
    return k8_[layer].data() + Offset(page, head);
  }
  const int8_t* V8(int layer, int32_t page, int head) const {
    return v8_[layer].data() + Offset(page, head);
  }
  // [head_dim] per-channel K scales.
  const float* KScale(int layer, int32_t page, int head) const {
    return kscale_[layer].data() + MetaOffset(page, head);
  }
  float VScale(int layer, int32_t page, int head) const {
    return vscale_[layer][ScaleOffset(page, head)];
  }
  // [head_dim] bounds of one page, layer and head.
  const float* KMin(int layer, int32_t page, int head) const {
    return kmin_[layer].data() + MetaOffset(page, head);
  }
  const float* KMax(int layer, int32_t page, int head) const {
    return kmax_[layer].data() + MetaOffset(page, head);
  }

  // Empties the metadata of a page in every layer (min = +inf, max = -inf; int8 scales 0).
  void ResetPage(int32_t page);
  // Stores one token's keys and values (all local KV heads, [n_kv_heads][head_dim] floats) in
  // a page slot and widens the page's bounding box (int8: re-quantizes the page when the token
  // needs a larger scale).
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
  size_t ScaleOffset(int32_t page, int head) const {
    return static_cast<size_t>(page) * config_.n_kv_heads + head;
  }
  // Quantizes one head's row x[head_dim] into row `slot` of block ([page_size][head_dim]),
  // with one scale per channel (per_channel: scale[head_dim]) or one for all (scale[1]); first
  // re-quantizes the values under a scale that x outgrows, and, if box_min is set, the box.
  void WriteInt8Row(const float* x, int8_t* block, int slot, float* scale, bool per_channel,
                    float* box_min, float* box_max);

  KvCacheConfig config_;
  std::vector<std::vector<fp16_t>> k_, v_;         // kF16
  std::vector<std::vector<int8_t>> k8_, v8_;       // kInt8
  std::vector<std::vector<float>> kscale_, vscale_;  // kInt8
  std::vector<std::vector<float>> kmin_, kmax_;
};

}  // namespace tinyserve
