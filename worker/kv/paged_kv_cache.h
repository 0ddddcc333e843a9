// File: worker/kv/paged_kv_cache.h
// Storage of the paged KV cache and its page metadata (the bounding box of each page's keys).
//
// Layout, per layer (one contiguous block each):
//   K, V      [num_pages][n_kv_heads][page_size][head_dim]   fp16, or int8 with KvDtype::kInt8
//   kmin,kmax [num_pages][n_kv_heads][head_dim]              fp16 (bounds rounded outwards)
//   kscale    [num_pages][n_kv_heads][head_dim]              fp32 (int8 only)
//   vscale    [num_pages][n_kv_heads]                        fp32 (int8 only)
// A page id addresses the same token positions in every layer. Token t of a sequence lives in
// page table[t / page_size], slot t % page_size. Keys are stored after RoPE.
//
// Metadata invariant: for every page, layer and KV head, kmin[d] <= k[d] <= kmax[d] for each
// stored (fp16-rounded) key of the page's valid slots; it is kept by WriteToken (running min/max)
// and reset by ResetPage when a page is (re)allocated. The bounds are fp16: exact (tight) for
// fp16 keys; for int8 pages the dequantized keys' min and max are rounded down and up. A page shared by several sequences (prefix
// cache) is only written before it is shared, so it shares its metadata too.
//
// int8 storage: a stored value is q * scale with q in [-127, 127]; scales are per page, layer
// and KV head: for K one per channel (keys after RoPE have channels of very different
// magnitude), for V one for the whole block. A page is quantized once, when its last slot is
// written in a layer: until then its tokens live in an fp16 stage (one per page being filled,
// all layers) and attention reads them from there (StagedK/StagedV), so every value is rounded
// once, at the final scales (max |x| / 127 over the page), and never re-quantized. When the
// page is quantized its box is recomputed over the dequantized keys q * scale, computed in fp32
// exactly as attention computes them. Error per element: at most scale / 2.
// Stages are bounded (KvCacheConfig::max_staged_pages): past the bound the least recently
// staged page is quantized as it is (its unwritten slots are zero) to free one; if that page is
// written again it is staged again from its dequantized values.

// Memory overhead of the metadata: 2 * head_dim * 2 bytes per page and KV head against
// 2 * page_size * head_dim * 2 bytes of K+V: 1 / page_size (6.25% at page size 16).
// int8 K+V take half the bytes of fp16; their scales add (head_dim + 1) * 4 bytes per page and
// KV head (page size 16, head_dim 64: int8 K+V+scales+box = 58.9% of fp16 K+V+box).
// Accuracy: docs/PERFORMANCE.md "int8 KV cache".
//
// Thread safety: WriteToken, ResetPage and CopyPage run on one thread at a time (the engine's
// or the evaluator's); attention reads (from any number of threads) while no one writes.
#pragma once

#include <cstdint>
#include <memory>
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
  int max_staged_pages = 256;  // int8: pages held in fp16 while being filled (see above)
};

class PagedKvCache {
 public:
  explicit PagedKvCache(const KvCacheConfig& config);

  const KvCacheConfig& config() const { return config_; }
  // Bytes of K+V elements per token (all layers and heads of this rank), and of one page
  // (without the per-page scales and box).
  int64_t BytesPerToken() const;
  int64_t BytesPerPage() const { return BytesPerToken() * config_.page_size; }
  // Bytes a config of n pages needs (K, V, int8 scales and the box metadata; int8 adds up to
  // max_staged_pages pages of fp16 K+V for the pages being filled).
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
  // int8: the fp16 [page_size][head_dim] blocks of a page still being filled in this layer, or
  // null once it is quantized (then K8/V8 hold it).
  const fp16_t* StagedK(int layer, int32_t page, int head) const;
  const fp16_t* StagedV(int layer, int32_t page, int head) const;
  int staged_pages() const;
  // [head_dim] bounds of one page, layer and head.
  const fp16_t* KMin(int layer, int32_t page, int head) const {
    return kmin_[layer].data() + MetaOffset(page, head);
  }
  const fp16_t* KMax(int layer, int32_t page, int head) const {
    return kmax_[layer].data() + MetaOffset(page, head);
  }

  // Empties the metadata of a page in every layer (min = +inf, max = -inf; int8 scales 0, stage
  // dropped).
  void ResetPage(int32_t page);
  // Stores one token's keys and values (all local KV heads, [n_kv_heads][head_dim] floats) in
  // a page slot and widens the page's bounding box (int8: into the page's fp16 stage; the last
  // slot quantizes the page in this layer).
  void WriteToken(int layer, int32_t page, int slot, const float* k, const float* v);
  // Forgets slots [valid, page_size) of a page in every layer (speculative tokens that were
  // rejected): the box is rebuilt from the keys of slots [0, valid), as if only they had been
  // written; valid == 0 is ResetPage. int8 REQUIRES: the page is still staged in every layer
  // (none of the forgotten slots was its last one).
  void TruncatePage(int32_t page, int valid);
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
  // int8 staging. A stage holds fp16 K and V of one page, [n_layers][n_kv_heads][page_size]
  // [head_dim]; quantized[l] says layer l has been quantized into k8_/v8_.
  struct Stage {
    std::vector<fp16_t> k, v;
    std::vector<uint8_t> quantized;
    int layers_left = 0;
    int32_t page = -1;
    int64_t born = 0;
  };
  size_t StageOffset(int layer, int head) const {
    return (static_cast<size_t>(layer) * config_.n_kv_heads + head) * config_.page_size *
           config_.head_dim;
  }
  const Stage* StageOf(int32_t page) const {
    const int32_t i = stage_of_[page];
    return i < 0 ? nullptr : stages_[i].get();
  }
  // The page's stage, made (from its current int8 contents) if it has none.
  Stage& Staged(int32_t page);
  // Quantizes layer `layer` of a staged page from its stage (scales, int8 data, box).
  void QuantizeLayer(int layer, int32_t page, const Stage& st);
  void DropStage(int32_t page);

  KvCacheConfig config_;
  std::vector<std::vector<fp16_t>> k_, v_;         // kF16
  std::vector<std::vector<int8_t>> k8_, v8_;       // kInt8
  std::vector<std::vector<float>> kscale_, vscale_;  // kInt8
  std::vector<std::vector<fp16_t>> kmin_, kmax_;
  // int8 stages: stage_of_[page] indexes stages_ (-1: none); free slots are reused.
  std::vector<int32_t> stage_of_;
  std::vector<std::unique_ptr<Stage>> stages_;
  std::vector<int32_t> free_stages_;
  int64_t stage_clock_ = 0;
};

}  // namespace tinyserve
