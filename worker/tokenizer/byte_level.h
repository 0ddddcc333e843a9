// File: worker/tokenizer/byte_level.h
// GPT-2's bytes_to_unicode map (model-formats.md §6.1): bytes 0x21-0x7E, 0xA1-0xAC and
// 0xAE-0xFF stand for the code point of the same value; the other 68 bytes map, in increasing
// byte order, to U+0100, U+0101, ... (space -> U+0120 'Ġ', newline -> U+010A 'Ċ').
//
// Thread safety: pure functions over constant tables.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tinyserve {

// The code point byte b stands for.
uint32_t ByteToCodepoint(uint8_t b);
// The byte code point cp stands for, or -1 if cp is not in the map.
int CodepointToByte(uint32_t cp);
// Maps every byte of raw to its code point, UTF-8 encoded.
std::string ByteLevelEncode(std::string_view raw);
// Inverse of ByteLevelEncode; code points outside the map are kept as their UTF-8.
std::string ByteLevelDecode(std::string_view mapped);

}  // namespace tinyserve
