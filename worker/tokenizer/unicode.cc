// File: worker/tokenizer/unicode.cc
#include "worker/tokenizer/unicode.h"

#include <algorithm>
#include <iterator>

namespace tinyserve {
namespace unicode_internal {
#include "worker/tokenizer/unicode_tables.inc"
}  // namespace unicode_internal

namespace {

template <size_t N>
bool InRanges(const CodepointRange (&table)[N], uint32_t cp) {
  const CodepointRange* end = table + N;
  // First range whose last >= cp.
  const CodepointRange* it = std::lower_bound(
      table, end, cp, [](const CodepointRange& r, uint32_t v) { return r.last < v; });
  return it != end && it->first <= cp;
}

}  // namespace

int Utf8SequenceLength(uint8_t lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

uint32_t DecodeUtf8(std::string_view s, size_t* offset) {
  const size_t i = *offset;
  const uint8_t b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) {
    *offset = i + 1;
    return b0;
  }
  const int len = Utf8SequenceLength(b0);
  if (len == 1 || i + len > s.size()) {
    *offset = i + 1;
    return kReplacementChar;
  }
  uint32_t cp = b0 & (0x7F >> len);
  for (int k = 1; k < len; ++k) {
    const uint8_t b = static_cast<uint8_t>(s[i + k]);
    if ((b & 0xC0) != 0x80) {
      *offset = i + 1;
      return kReplacementChar;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  // Reject overlong forms, surrogates and values past U+10FFFF.
  static constexpr uint32_t kMinForLength[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMinForLength[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    *offset = i + 1;
    return kReplacementChar;
  }
  *offset = i + len;
  return cp;
}

std::vector<uint32_t> DecodeUtf8All(std::string_view s, std::vector<size_t>* byte_offsets) {
  std::vector<uint32_t> cps;
  cps.reserve(s.size());
  if (byte_offsets != nullptr) {
    byte_offsets->clear();
    byte_offsets->reserve(s.size() + 1);
  }
  size_t offset = 0;
  while (offset < s.size()) {
    if (byte_offsets != nullptr) byte_offsets->push_back(offset);
    cps.push_back(DecodeUtf8(s, &offset));
  }
  if (byte_offsets != nullptr) byte_offsets->push_back(s.size());
  return cps;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string EncodeUtf8(uint32_t cp) {
  std::string out;
  AppendUtf8(cp, &out);
  return out;
}

bool IsLetter(uint32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return InRanges(unicode_internal::kLetterRanges, cp);
}

bool IsNumber(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return InRanges(unicode_internal::kNumberRanges, cp);
}

bool IsWhitespace(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  return InRanges(unicode_internal::kWhitespaceRanges, cp);
}

}  // namespace tinyserve
