// File: worker/engine/ngram_draft.h
// Prompt-lookup drafting for speculative decoding (vLLM's "ngram" method, llama.cpp's lookup
// decoding): the tokens that followed the most recent earlier occurrence of the sequence's last
// n tokens, trying n from max_n down to min_n. No draft model: it pays off where the output
// repeats its context (quoting, editing, extraction, structured data) and costs nothing
// otherwise, since a step without a match decodes as usual.
#pragma once

#include <cstdint>
#include <vector>

namespace tinyserve {

// Fills out with at most max_draft tokens proposed to follow tokens[0, len) (cleared first);
// empty when no n-gram of the tail occurs earlier. O(len * max_n) per call.
void NgramDraft(const int32_t* tokens, int64_t len, int min_n, int max_n, int max_draft,
                std::vector<int32_t>* out);

}  // namespace tinyserve
