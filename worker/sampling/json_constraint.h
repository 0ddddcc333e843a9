// File: worker/sampling/json_constraint.h
// Constrained decoding for OpenAI's response_format {"type": "json_object"}: the output is held
// to one JSON object (RFC 8259), token by token.
//
//   JsonRecognizer      a byte-level pushdown recognizer, fed incrementally; copyable (a fixed
//                       stack), so a candidate token is tried on a copy.
//   JsonObjectConstraint which tokens may come next: a token is allowed when its bytes continue
//                       the object; end-of-generation tokens only once the object is closed;
//                       other special tokens never.
//
// Bounds that keep a small model from looping inside the grammar: at most 24 whitespace bytes
// in a row (pretty-printing fits), numbers of at most 32 bytes, nesting at most 32 deep.
// max_tokens still bounds the whole output (then finish_reason is "length", as with OpenAI).
//
// Thread safety: per request, like the Sampler that owns it.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tinyserve {

class JsonRecognizer {
 public:
  // Feeds bytes. False when they cannot continue a JSON object text; the state is then
  // unspecified (feed a copy to test).
  bool Feed(std::string_view bytes);
  // One whole top-level object has been read; only whitespace may follow.
  bool Complete() const { return mode_ == Mode::kDone; }

 private:
  enum class Mode : uint8_t {
    kStart,         // before the top-level object: whitespace or '{'
    kValue,         // a value must start
    kKeyOrClose,    // just after '{'
    kKey,           // after ',' in an object
    kColon,         // after a key
    kAfterValue,    // ',' or the container's close
    kValueOrClose,  // just after '['
    kString,
    kEscape,
    kUnicode,
    kNumber,
    kLiteral,
    kDone,
  };
  enum class Num : uint8_t { kMinus, kZero, kInt, kDot, kFrac, kE, kESign, kExp };

  bool Byte(unsigned char c);
  bool StartValue(unsigned char c);
  bool Close(unsigned char c);

  static constexpr int kMaxDepth = 32;
  static constexpr int kMaxWhitespace = 24;
  static constexpr int kMaxNumber = 32;

  Mode mode_ = Mode::kStart;
  Num num_ = Num::kMinus;
  bool key_ = false;               // the string being read is an object key
  uint8_t left_ = 0;               // kUnicode: hex digits left; kNumber: bytes read
  uint8_t whitespace_ = 0;         // consecutive whitespace bytes
  const char* literal_ = nullptr;  // kLiteral: the rest of "true", "false" or "null"
  int depth_ = 0;
  std::array<char, kMaxDepth> stack_{};  // '{' or '['
};

// Per token: its bytes and how a constraint treats it.
struct TokenTable {
  enum Kind : uint8_t { kNormal, kSpecial, kEnd };
  std::vector<std::string> bytes;
  std::vector<Kind> kind;
};

class JsonObjectConstraint {
 public:
  explicit JsonObjectConstraint(std::shared_ptr<const TokenTable> table)
      : table_(std::move(table)) {}

  bool Allows(int32_t id) const;
  // Commits a token (one Allows accepted).
  void Accept(int32_t id);
  bool Complete() const { return state_.Complete(); }

 private:
  std::shared_ptr<const TokenTable> table_;
  JsonRecognizer state_;
};

}  // namespace tinyserve
