// File: worker/tokenizer/pre_tokenizer.h
// Pre-tokenizers of byte-level BPE: split text into the pieces that BPE merges within.
// See shared/reference/model-formats.md §6.1.
//
//   kGpt2:   the GPT-2 regex 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|
//            \s+(?!\S)|\s+, hand-coded after llama.cpp's unicode_regex_split_custom_gpt2
//            (contractions are matched case-sensitively, as in the original pattern).
//   kSmollm: first every \p{N} code point becomes its own piece, then kGpt2 splits the
//            stretches in between (the lookahead never looks across a digit).
//
// Pieces are views into the input and cover it completely, in order.
// Thread safety: pure functions.
#pragma once

#include <string_view>
#include <vector>

namespace tinyserve {

enum class PreTokenizerKind { kGpt2, kSmollm };

std::vector<std::string_view> PreTokenize(std::string_view text, PreTokenizerKind kind);

}  // namespace tinyserve
