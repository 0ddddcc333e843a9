// File: worker/tokenizer/pre_tokenizer.h
// Pre-tokenizers of byte-level BPE: split text into the pieces that BPE merges within.
// See shared/reference/model-formats.md §6.1.
//
//   kGpt2:   the GPT-2 regex 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|
//            \s+(?!\S)|\s+, hand-coded after llama.cpp's unicode_regex_split_custom_gpt2
//            (contractions are matched case-sensitively, as in the original pattern).
//   kSmollm: first every \p{N} code point becomes its own piece, then kGpt2 splits the
//            stretches in between (the lookahead never looks across a digit).
//   kLlama3: the Llama 3 regex (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+, hand-coded after llama.cpp's
//            unicode_regex_split_custom_llama3 (GGUF pre "llama-bpe", "llama3", "falcon3").
//   kQwen2:  the same with \p{N} instead of \p{N}{1,3} (GGUF pre "qwen2", "deepseek-r1-qwen").
//
// Pieces are views into the input and cover it completely, in order.
// Thread safety: pure functions.
#pragma once

#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tinyserve {

enum class PreTokenizerKind { kGpt2, kSmollm, kLlama3, kQwen2 };

std::vector<std::string_view> PreTokenize(std::string_view text, PreTokenizerKind kind);

// The kind for a GGUF tokenizer.ggml.pre value (llama.cpp's names; "" and "default" are
// kGpt2); an error naming the value for one TinyServe does not implement, since splitting
// text by the wrong rules silently changes every prompt's tokens.
absl::StatusOr<PreTokenizerKind> PreTokenizerFromName(std::string_view name);

}  // namespace tinyserve
