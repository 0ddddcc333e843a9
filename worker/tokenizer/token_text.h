// File: worker/tokenizer/token_text.h
// The bytes a vocabulary entry stands for, by its type (as llama.cpp's token_to_piece with
// special rendering on):
//   CONTROL, USER_DEFINED, UNKNOWN  its text verbatim;
//   BYTE                            "<0xNN>" -> the byte 0xNN;
//   UNUSED                          nothing;
//   NORMAL (and UNDEFINED)          byte-level: the inverse bytes_to_unicode map;
//                                   SentencePiece: "▁" (U+2581) -> " ".
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "worker/tokenizer/tokenizer.h"

namespace tinyserve {

enum class TokenEscape { kByteLevel, kSentencePiece };

std::string TokenTextToBytes(std::string_view text, TokenType type, TokenEscape escape);

// Parses "<0xNN>" (two hex digits); -1 if text is not of that form.
int ParseByteToken(std::string_view text);

// Replaces every " " by "▁" (SentencePiece's whitespace escape).
std::string EscapeSpaces(std::string_view text);

}  // namespace tinyserve
