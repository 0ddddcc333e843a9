// File: worker/tokenizer/unicode.cc
#include "worker/tokenizer/unicode.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <utility>

namespace tinyserve {
namespace unicode_internal {
struct CombiningClassRange {
  uint32_t first, last, ccc;
};
struct Decomposition {
  uint32_t cp, first, second;  // second 0: a singleton
};
struct Composition {
  uint32_t first, second, composite;
};
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

namespace {

// Hangul syllables compose and decompose algorithmically (Unicode §3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

uint32_t CombiningClass(uint32_t cp) {
  using unicode_internal::kCombiningClass;
  if (cp < 0x300) return 0;
  const auto* end = std::end(kCombiningClass);
  const auto* it = std::lower_bound(std::begin(kCombiningClass), end, cp,
                                    [](const auto& r, uint32_t v) { return r.last < v; });
  return it != end && it->first <= cp ? it->ccc : 0;
}

void Decompose(uint32_t cp, std::vector<uint32_t>* out) {
  using unicode_internal::kDecomposition;
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  const auto* end = std::end(kDecomposition);
  const auto* it = std::lower_bound(std::begin(kDecomposition), end, cp,
                                    [](const auto& d, uint32_t v) { return d.cp < v; });
  if (it == end || it->cp != cp) {
    out->push_back(cp);
    return;
  }
  Decompose(it->first, out);
  if (it->second != 0) Decompose(it->second, out);
}

// The primary composite of (a, b), or 0.
uint32_t Compose(uint32_t a, uint32_t b) {
  using unicode_internal::kComposition;
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  const auto* end = std::end(kComposition);
  const auto* it = std::lower_bound(std::begin(kComposition), end, std::make_pair(a, b),
                                    [](const auto& c, const std::pair<uint32_t, uint32_t>& v) {
                                      return std::make_pair(c.first, c.second) < v;
                                    });
  return it != end && it->first == a && it->second == b ? it->composite : 0;
}

}  // namespace

bool NormalizeNfc(std::string_view s, std::string* out) {
  // Quick check: only text holding a code point of kNfcUnstable can change.
  bool maybe = false;
  for (size_t i = 0; i < s.size() && !maybe;) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t at = i;
    const uint32_t cp = DecodeUtf8(s, &i);
    if (cp == kReplacementChar && s.substr(at, 3) != "\xEF\xBF\xBD") return false;  // invalid
    maybe = cp >= 0x300 && InRanges(unicode_internal::kNfcUnstable, cp);
  }
  if (!maybe) return false;
  std::vector<uint32_t> d;
  d.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t at = i;
    const uint32_t cp = DecodeUtf8(s, &i);
    if (cp == kReplacementChar && s.substr(at, 3) != "\xEF\xBF\xBD") return false;
    Decompose(cp, &d);
  }
  // Canonical ordering: each run of non-starters sorted by class, stably.
  for (size_t i = 0; i < d.size();) {
    if (CombiningClass(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && CombiningClass(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + i, d.begin() + j,
                     [](uint32_t a, uint32_t b) { return CombiningClass(a) < CombiningClass(b); });
    i = j;
  }
  // Canonical composition: a character joins the last starter unless something between them
  // blocks it (a starter, or a non-starter of the same or a higher class).
  std::vector<uint32_t> c;
  c.reserve(d.size());
  size_t starter = SIZE_MAX;
  int last_class = -1;  // of the latest character kept after the starter; -1: none yet
  for (uint32_t cp : d) {
    const int cls = static_cast<int>(CombiningClass(cp));
    if (starter != SIZE_MAX && (last_class == -1 || (last_class != 0 && last_class < cls))) {
      if (const uint32_t composite = Compose(c[starter], cp)) {
        c[starter] = composite;
        continue;
      }
    }
    if (cls == 0) {
      starter = c.size();
      last_class = -1;
    } else {
      last_class = cls;
    }
    c.push_back(cp);
  }
  out->clear();
  for (uint32_t cp : c) AppendUtf8(cp, out);
  return true;
}

}  // namespace tinyserve
