// File: worker/tokenizer/pre_tokenizer.cc
#include "worker/tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "worker/tokenizer/unicode.h"

namespace tinyserve {
namespace {

// Per-code-point class bits. kInRange marks a position inside the current range, so that a
// zero means "past the end" as llama.cpp's OUT_OF_RANGE does.
enum : uint8_t { kLetter = 1, kNumber = 2, kSpace = 4, kInRange = 8 };

uint8_t ClassOf(uint32_t cp) {
  uint8_t f = kInRange;
  if (IsLetter(cp))
    f |= kLetter;
  else if (IsNumber(cp))
    f |= kNumber;
  else if (IsWhitespace(cp))
    f |= kSpace;
  return f;
}

bool IsOther(uint8_t f) { return f != 0 && (f & (kLetter | kNumber | kSpace)) == 0; }

// The length of the contraction 's, 't, 're, 've, 'm, 'll or 'd at cps[pos] (ASCII letters in
// either case when any_case), or 0.
size_t ContractionLength(const std::vector<uint32_t>& cps, size_t pos, size_t end, bool any_case) {
  auto at = [&](size_t i) -> uint32_t {
    const uint32_t c = cps[i];
    return any_case && c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c;
  };
  if (cps[pos] != '\'' || pos + 1 >= end) return 0;
  const uint32_t n1 = at(pos + 1);
  if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') return 2;
  if (pos + 2 >= end) return 0;
  const uint32_t n2 = at(pos + 2);
  return (n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l') ? 3 : 0;
}

// The end of the last alternatives of both regexes at `pos`, where `spaces` whitespace code
// points start: '\s+(?!\S)' (leaving the last space to the word that follows), '\s+', or no
// match (one code point).
size_t WhitespaceEnd(size_t pos, size_t spaces, size_t end) {
  if (spaces > 1 && pos + spaces < end) return pos + spaces - 1;
  return pos + std::max<size_t>(spaces, 1);
}

// Splits code points [ini, end) by the GPT-2 regex; appends piece lengths in code points.
void SplitGpt2(const std::vector<uint32_t>& cps, const std::vector<uint8_t>& cls, size_t ini,
               size_t end, std::vector<size_t>* lengths) {
  auto flags = [&](size_t pos) -> uint8_t { return pos < end ? cls[pos] : 0; };
  size_t prev_end = ini;
  auto add = [&](size_t stop) {
    if (stop > prev_end) lengths->push_back(stop - prev_end);
    prev_end = stop;
  };

  for (size_t pos = ini; pos < end;) {
    const uint32_t c = cps[pos];
    // 's|'t|'re|'ve|'m|'ll|'d
    if (const size_t n = ContractionLength(cps, pos, end, /*any_case=*/false); n > 0) {
      pos += n;
      add(pos);
      continue;
    }
    uint8_t f2 = (c == ' ') ? flags(pos + 1) : cls[pos];
    // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+'
    if (f2 & kLetter) {
      pos += (c == ' ');
      while (flags(pos) & kLetter) ++pos;
      add(pos);
      continue;
    }
    if (f2 & kNumber) {
      pos += (c == ' ');
      while (flags(pos) & kNumber) ++pos;
      add(pos);
      continue;
    }
    if (IsOther(f2)) {
      pos += (c == ' ');
      while (IsOther(flags(pos))) ++pos;
      add(pos);
      continue;
    }
    size_t spaces = 0;
    while (flags(pos + spaces) & kSpace) ++spaces;
    pos = WhitespaceEnd(pos, spaces, end);
    add(pos);
  }
}

// Splits code points [ini, end) by the Llama 3 regex (max_digits 3) or Qwen2's (max_digits 1);
// appends piece lengths in code points.
void SplitLlama3(const std::vector<uint32_t>& cps, const std::vector<uint8_t>& cls, size_t ini,
                 size_t end, size_t max_digits, std::vector<size_t>* lengths) {
  auto flags = [&](size_t pos) -> uint8_t { return pos < end ? cls[pos] : 0; };
  auto newline = [](uint32_t c) { return c == '\r' || c == '\n'; };
  size_t prev_end = ini;
  auto add = [&](size_t stop) {
    if (stop > prev_end) lengths->push_back(stop - prev_end);
    prev_end = stop;
  };

  for (size_t pos = ini; pos < end;) {
    const uint32_t c = cps[pos];
    const uint8_t f = cls[pos];
    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if (const size_t n = ContractionLength(cps, pos, end, /*any_case=*/true); n > 0) {
      pos += n;
      add(pos);
      continue;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (!newline(c) && !(f & kNumber) && ((f & kLetter) || (flags(pos + 1) & kLetter))) {
      ++pos;
      while (flags(pos) & kLetter) ++pos;
      add(pos);
      continue;
    }
    // \p{N}{1,max_digits}
    if (f & kNumber) {
      size_t run = pos;
      while (flags(pos) & kNumber) {
        if (++pos - run >= max_digits) {
          add(pos);
          run = pos;
        }
      }
      add(pos);
      continue;
    }
    // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    if (IsOther(c == ' ' ? flags(pos + 1) : f)) {
      pos += (c == ' ');
      while (IsOther(flags(pos))) ++pos;
      while (pos < end && newline(cps[pos])) ++pos;
      add(pos);
      continue;
    }
    size_t spaces = 0, last_newline_end = 0;
    while (flags(pos + spaces) & kSpace) {
      if (newline(cps[pos + spaces])) last_newline_end = pos + spaces + 1;
      ++spaces;
    }
    // '\s*[\r\n]+'
    if (last_newline_end > 0) {
      pos = last_newline_end;
      add(pos);
      continue;
    }
    pos = WhitespaceEnd(pos, spaces, end);
    add(pos);
  }
}

}  // namespace

absl::StatusOr<PreTokenizerKind> PreTokenizerFromName(std::string_view name) {
  if (name.empty() || name == "default" || name == "gpt-2" || name == "gpt2" || name == "phi-2")
    return PreTokenizerKind::kGpt2;
  if (name == "smollm") return PreTokenizerKind::kSmollm;
  if (name == "llama-bpe" || name == "llama3" || name == "llama-v3" || name == "falcon3")
    return PreTokenizerKind::kLlama3;
  if (name == "qwen2" || name == "deepseek-r1-qwen") return PreTokenizerKind::kQwen2;
  return absl::InvalidArgumentError(absl::StrCat(
      "tokenizer: pre-tokenizer '", std::string(name),
      "' (GGUF tokenizer.ggml.pre) is not supported; TinyServe splits text as gpt-2, smollm, "
      "llama-bpe (Llama 3) and qwen2"));
}

std::vector<std::string_view> PreTokenize(std::string_view text, PreTokenizerKind kind) {
  std::vector<size_t> byte_offsets;
  const std::vector<uint32_t> cps = DecodeUtf8All(text, &byte_offsets);
  std::vector<uint8_t> cls(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) cls[i] = ClassOf(cps[i]);

  std::vector<size_t> lengths;  // in code points
  lengths.reserve(cps.size() / 3 + 1);
  if (kind == PreTokenizerKind::kSmollm) {
    size_t start = 0;
    for (size_t i = 0; i < cps.size(); ++i) {
      if (cls[i] & kNumber) {
        if (i > start) SplitGpt2(cps, cls, start, i, &lengths);
        lengths.push_back(1);
        start = i + 1;
      }
    }
    if (start < cps.size()) SplitGpt2(cps, cls, start, cps.size(), &lengths);
  } else if (kind == PreTokenizerKind::kLlama3 || kind == PreTokenizerKind::kQwen2) {
    SplitLlama3(cps, cls, 0, cps.size(), kind == PreTokenizerKind::kLlama3 ? 3 : 1, &lengths);
  } else {
    SplitGpt2(cps, cls, 0, cps.size(), &lengths);
  }

  std::vector<std::string_view> pieces;
  pieces.reserve(lengths.size());
  size_t cp_pos = 0;
  for (size_t len : lengths) {
    const size_t b0 = byte_offsets[cp_pos];
    const size_t b1 = byte_offsets[cp_pos + len];
    pieces.push_back(text.substr(b0, b1 - b0));
    cp_pos += len;
  }
  return pieces;
}

}  // namespace tinyserve
