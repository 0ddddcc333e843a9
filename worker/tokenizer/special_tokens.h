// File: worker/tokenizer/special_tokens.h
// Cuts special-token text out of raw text before BPE (model-formats.md §6.2), as llama.cpp's
// tokenizer_st_partition does: tokens of type CONTROL, USER_DEFINED and UNKNOWN are tried one
// at a time, longest text first, and each splits every remaining raw fragment at all of its
// occurrences. With parse_special off only USER_DEFINED tokens are cut out.
//
// Thread safety: immutable after construction.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "worker/tokenizer/tokenizer.h"

namespace tinyserve {

struct TextFragment {
  int32_t token = -1;     // >= 0: a special token; -1: raw text
  std::string_view text;  // the raw text (a view into the input) when token < 0
};

class SpecialTokenSplitter {
 public:
  explicit SpecialTokenSplitter(const TokenizerData& data);

  // Fragments in text order; raw fragments are never empty.
  std::vector<TextFragment> Split(std::string_view text, bool parse_special) const;

 private:
  struct Entry {
    std::string_view text;  // into the TokenizerData, which outlives this
    int32_t id;
    bool always;  // USER_DEFINED: cut out even when parse_special is off
  };
  std::vector<Entry> entries_;  // longest text first, then lowest id
};

}  // namespace tinyserve
