// File: worker/tokenizer/byte_level.cc
#include "worker/tokenizer/byte_level.h"

#include <array>

#include "worker/tokenizer/unicode.h"

namespace tinyserve {
namespace {

struct ByteMap {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 512> from_cp{};  // every mapped code point is < 0x144

  ByteMap() {
    from_cp.fill(-1);
    uint32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool self = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_cp[b] = self ? static_cast<uint32_t>(b) : next++;
      from_cp[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteMap& Map() {
  static const ByteMap map;
  return map;
}

}  // namespace

uint32_t ByteToCodepoint(uint8_t b) { return Map().to_cp[b]; }

int CodepointToByte(uint32_t cp) { return cp < 512 ? Map().from_cp[cp] : -1; }

std::string ByteLevelEncode(std::string_view raw) {
  std::string out;
  out.reserve(raw.size() * 2);
  for (char c : raw) AppendUtf8(ByteToCodepoint(static_cast<uint8_t>(c)), &out);
  return out;
}

std::string ByteLevelDecode(std::string_view mapped) {
  std::string out;
  out.reserve(mapped.size());
  size_t offset = 0;
  while (offset < mapped.size()) {
    const size_t start = offset;
    const uint32_t cp = DecodeUtf8(mapped, &offset);
    const int b = CodepointToByte(cp);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {
      out.append(mapped.substr(start, offset - start));
    }
  }
  return out;
}

}  // namespace tinyserve
