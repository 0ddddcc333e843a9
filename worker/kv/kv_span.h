// File: worker/kv/kv_span.h
// The attention kernel's view (KvSpan) of the first n slots of one page, layer and KV head of a
// PagedKvCache, for either storage type. Header-only: users link ts_kv and ts_attention_cpu.
#pragma once

#include <cstdint>

#include "kernels/cpu/attention.h"
#include "worker/kv/paged_kv_cache.h"

namespace tinyserve {

inline KvSpan PageSpan(const PagedKvCache& kv, int layer, int32_t page, int head, int n) {
  if (kv.dtype() == KvDtype::kInt8) {
    if (const fp16_t* k = kv.StagedK(layer, page, head)) {  // a page still being filled
      KvSpan s;
      s.k = k;
      s.v = kv.StagedV(layer, page, head);
      s.n = n;
      return s;
    }
    return KvSpan::Int8(kv.K8(layer, page, head), kv.KScale(layer, page, head),
                        kv.V8(layer, page, head), kv.VScale(layer, page, head), n);
  }
  KvSpan s;
  s.k = kv.K(layer, page, head);
  s.v = kv.V(layer, page, head);
  s.n = n;
  return s;
}

// The span without its first k tokens (a sliding window that starts inside a page); the int8
// scales are per page and stay.
inline KvSpan SkipTokens(KvSpan s, int k, int head_dim) {
  const int64_t off = int64_t{k} * head_dim;
  if (s.type == KvSpanType::kInt8) {
    s.k8 += off;
    s.v8 += off;
  } else {
    s.k += off;
    s.v += off;
  }
  s.n -= k;
  return s;
}

}  // namespace tinyserve
