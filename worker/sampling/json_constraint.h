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
// in a row (pretty-printing fits), none after the value when decoding, numbers of at most 32
// bytes, nesting at most 32 deep.
// max_tokens still bounds the whole output (then finish_reason is "length", as with OpenAI).
//
// Thread safety: per request, like the Sampler that owns it.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace tinyserve {

// RFC 8259's number grammar, one byte at a time: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
enum class NumState : uint8_t { kMinus, kZero, kInt, kDot, kFrac, kE, kESign, kExp };
enum class NumStep : uint8_t { kReject, kMore, kEnded };  // kEnded: c is not part of it
// The first byte of a number ('-' or a digit) sets *state; false for anything else.
bool NumberStart(unsigned char c, NumState* state);
NumStep NumberNext(unsigned char c, bool integer, NumState* state);
inline bool NumberCanEnd(NumState s) {
  return s == NumState::kZero || s == NumState::kInt || s == NumState::kFrac || s == NumState::kExp;
}
inline bool IsJsonWhitespace(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}
inline constexpr int kMaxJsonWhitespace = 24;  // whitespace bytes in a row between tokens
inline constexpr int kMaxJsonNumber = 32;      // bytes of one number

class JsonRecognizer {
 public:
  // object_only: the text must be an object (json_object); else any JSON value.
  // trailing_space: whitespace may follow the value (parsing text); decoding passes false, so
  // the output ends where the value does (a small model would otherwise pad it to the bound).
  explicit JsonRecognizer(bool object_only = true, bool trailing_space = true)
      : object_only_(object_only), trailing_space_(trailing_space) {}

  // Feeds bytes. False when they cannot continue a JSON object text; the state is then
  // unspecified (feed a copy to test).
  bool Feed(std::string_view bytes);
  bool Byte(unsigned char c);
  // One whole top-level value has been read; only whitespace may follow.
  bool Complete() const { return mode_ == Mode::kDone; }
  // The value may end before the next byte: complete, or a top-level number that could stop.
  bool CanEnd() const {
    return Complete() || (mode_ == Mode::kNumber && depth_ == 0 && NumberCanEnd(num_));
  }

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

  bool StartValue(unsigned char c);
  // What follows a finished value: the container's ',' or close, or the end of the text.
  Mode AfterValue() const { return depth_ == 0 ? Mode::kDone : Mode::kAfterValue; }
  bool Close(unsigned char c);

  static constexpr int kMaxDepth = 32;

  bool object_only_ = true;
  bool trailing_space_ = true;
  Mode mode_ = Mode::kStart;
  NumState num_ = NumState::kMinus;
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
  // The normal tokens with bytes, sorted by them, and per entry how many leading bytes it shares
  // with the entry before: a constraint's full-vocabulary scan walks them as a trie (a prefix
  // many tokens share is matched once). Filled by Index(), after bytes and kind.
  std::vector<int32_t> sorted;
  std::vector<uint16_t> shared;
  size_t max_bytes = 0;
  void Index();
};

// Which tokens may come next under a byte-level recognizer R (JsonRecognizer for json_object,
// SchemaRecognizer for json_schema): a token whose bytes R accepts; end-of-generation only once
// R is complete; other special tokens never.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  virtual bool Allows(int32_t id) const = 0;
  // (*allowed)[id] = Allows(id) for every id below vocab; a constraint may do it faster.
  virtual void AllowedTokens(int vocab, std::vector<uint8_t>* allowed) const {
    allowed->resize(vocab);
    for (int i = 0; i < vocab; ++i) (*allowed)[i] = Allows(i);
  }
  // Commits a token (one Allows accepted).
  virtual void Accept(int32_t id) = 0;
  // Not OK once the constraint can no longer be held (a grammar too costly to match): the
  // output ends with this error.
  virtual absl::Status status() const { return absl::OkStatus(); }
};

// The full-vocabulary verdicts of a byte-level constraint, walking table.sorted as a trie:
// step(k, c) takes byte c from level k to level k + 1 (false: no text can continue from
// there), can_end(k) says whether a token may end at level k; level 0 is the committed state
// and levels go up to table.max_bytes. A prefix many tokens share is stepped once, and every
// token behind a dead prefix is skipped. End-of-generation tokens get end_ok. Needs Index().
// kAccumulate: *allowed already holds verdicts (of another state, same vocab); tokens allowed
// there are kept and not walked again, the others are allowed if this state allows them.
template <bool kAccumulate = false, typename Step, typename CanEnd>
void ScanTokenTable(const TokenTable& table, int vocab, bool end_ok, Step step, CanEnd can_end,
                    std::vector<uint8_t>* allowed) {
  const int n = std::min<int>(vocab, static_cast<int>(table.kind.size()));
  if constexpr (!kAccumulate) {
    allowed->assign(vocab, 0);
    for (int id = 0; id < n; ++id) {
      if (table.kind[id] == TokenTable::kEnd) (*allowed)[id] = end_ok;
    }
  }
  // Levels 0..valid hold the prefix of the last token walked; its first dead_at bytes cannot
  // continue (SIZE_MAX: it was alive).
  size_t valid = 0, dead_at = SIZE_MAX;
  for (size_t j = 0; j < table.sorted.size(); ++j) {
    const int32_t id = table.sorted[j];
    const std::string& b = table.bytes[id];
    const size_t shared = table.shared[j];
    if (dead_at <= shared) continue;  // behind the same dead prefix
    if constexpr (kAccumulate) {
      if (id < n && (*allowed)[id]) {
        // Not walked: what the levels and the dead prefix say holds for the tokens after it
        // only as far as they share this one's first bytes.
        valid = std::min(valid, shared);
        dead_at = SIZE_MAX;
        continue;
      }
    }
    dead_at = SIZE_MAX;
    size_t k = std::min(shared, valid);
    for (; k < b.size(); ++k) {
      if (!step(k, static_cast<unsigned char>(b[k]))) {
        dead_at = k + 1;
        break;
      }
    }
    valid = k;
    if (dead_at == SIZE_MAX && id < n && can_end(k)) (*allowed)[id] = 1;
  }
}

template <typename R>
class RecognizerConstraint final : public TokenConstraint {
 public:
  RecognizerConstraint(std::shared_ptr<const TokenTable> table, R start)
      : table_(std::move(table)), state_(std::move(start)) {}

  bool Allows(int32_t id) const override {
    if (id < 0 || static_cast<size_t>(id) >= table_->kind.size()) return false;
    if (table_->kind[id] == TokenTable::kEnd) return state_.Complete();
    if (table_->kind[id] == TokenTable::kSpecial || table_->bytes[id].empty()) return false;
    R next = state_;
    return next.Feed(table_->bytes[id]);
  }
  void AllowedTokens(int vocab, std::vector<uint8_t>* allowed) const override {
    if (table_->sorted.empty()) return TokenConstraint::AllowedTokens(vocab, allowed);
    levels_.assign(table_->max_bytes + 1, state_);
    ScanTokenTable(
        *table_, vocab, state_.Complete(),
        [&](size_t k, unsigned char c) {
          levels_[k + 1] = levels_[k];
          return levels_[k + 1].Feed(std::string_view(reinterpret_cast<const char*>(&c), 1));
        },
        [](size_t) { return true; }, allowed);
  }
  void Accept(int32_t id) override {
    if (id >= 0 && static_cast<size_t>(id) < table_->kind.size() &&
        table_->kind[id] == TokenTable::kNormal) {
      state_.Feed(table_->bytes[id]);
    }
  }
  bool Complete() const { return state_.Complete(); }

 private:
  std::shared_ptr<const TokenTable> table_;
  R state_;
  mutable std::vector<R> levels_;  // AllowedTokens' scratch: the state after each byte
};

// response_format json_object: one JSON object.
using JsonObjectConstraint = RecognizerConstraint<JsonRecognizer>;

}  // namespace tinyserve
