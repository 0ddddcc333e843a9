// File: worker/tokenizer/token_text.cc
#include "worker/tokenizer/token_text.h"

#include "worker/tokenizer/byte_level.h"

namespace tinyserve {
namespace {

constexpr std::string_view kSpaceEscape = "\xE2\x96\x81";  // U+2581 '▁'

std::string ReplaceAll(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  for (size_t hit = text.find(from); hit != std::string_view::npos; hit = text.find(from, pos)) {
    out.append(text.substr(pos, hit - pos)).append(to);
    pos = hit + from.size();
  }
  out.append(text.substr(pos));
  return out;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

int ParseByteToken(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  const int hi = HexValue(text[3]), lo = HexValue(text[4]);
  if (hi < 0 || lo < 0) return -1;
  return hi * 16 + lo;
}

std::string EscapeSpaces(std::string_view text) { return ReplaceAll(text, " ", kSpaceEscape); }

std::string TokenTextToBytes(std::string_view text, TokenType type, TokenEscape escape) {
  switch (type) {
    case TokenType::kControl:
    case TokenType::kUserDefined:
    case TokenType::kUnknown:
      return std::string(text);
    case TokenType::kUnused:
      return {};
    case TokenType::kByte: {
      const int b = ParseByteToken(text);
      if (b >= 0) return std::string(1, static_cast<char>(b));
      return std::string(text);
    }
    case TokenType::kNormal:
    case TokenType::kUndefined:
      break;
  }
  if (escape == TokenEscape::kByteLevel) return ByteLevelDecode(text);
  return ReplaceAll(text, kSpaceEscape, " ");
}

}  // namespace tinyserve
