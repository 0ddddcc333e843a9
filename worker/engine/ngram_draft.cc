#include "worker/engine/ngram_draft.h"

#include <algorithm>

namespace tinyserve {

void NgramDraft(const int32_t* tokens, int64_t len, int min_n, int max_n, int max_draft,
                std::vector<int32_t>* out) {
  out->clear();
  if (max_draft <= 0) return;
  for (int64_t n = std::min<int64_t>(max_n, len - 1); n >= std::max(1, min_n); --n) {
    const int32_t* tail = tokens + len - n;
    // The most recent earlier occurrence: start i < len - n, so at least one token follows it.
    for (int64_t i = len - n - 1; i >= 0; --i) {
      if (tokens[i] != tail[0] || !std::equal(tail + 1, tail + n, tokens + i + 1)) continue;
      const int64_t from = i + n, to = std::min<int64_t>(from + max_draft, len);
      out->assign(tokens + from, tokens + to);
      return;
    }
  }
}

}  // namespace tinyserve
