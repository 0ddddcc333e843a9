// File: worker/sampling/regex.h
// Regular expressions for constrained decoding: vLLM's guided_regex / structured_outputs.regex
// (the whole output matches) and JSON Schema's "pattern" (a string value contains a match).
// A pattern is compiled once into a DFA over Unicode code points whose dead states are cut
// away, so a recognizer refuses a byte as soon as no match can follow: no dead ends.
//
// Syntax: Python's re (and ECMA-262's) without what a DFA cannot do. Literals and escapes
// (\n \t \r \f \v \0 \xHH \uHHHH \U00HHHHHH, \ before punctuation), ".", classes ([a-z],
// [^...], with escapes), \d \D \w \W \s \S (ASCII, as Python's re.ASCII: [0-9], [A-Za-z0-9_],
// [ \t\n\r\f\v]), groups ((...), (?:...), (?P<name>...), (?<name>...)), "|", quantifiers
// (* + ? {n} {n,} {n,m} {,m}, lazy ones too: the language is the same), "^" and "$" at the
// start and end of a top-level branch. "." is any code point but "\n". An escaped surrogate
// pair (\uD83D\uDE00) is its one character. Refused with an error naming the offset:
// backreferences, lookaround, \b \B \A \Z, inline flags, anchors elsewhere, lone surrogates,
// repeat counts over 1000, and patterns whose automaton or its building would pass the caps
// (kMaxStates; regex.cc: transitions, steps). Options::search changes a few meanings to
// ECMA-262's (JSON Schema's).
//
// Thread safety: a compiled Regex is immutable (shared); recognizers are per request.
#pragma once

#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tinyserve {

class Regex {
 public:
  struct Options {
    // false: the whole text matches (guided_regex; Python's syntax). true: the text contains a
    // match, as JSON Schema's "pattern" reads it, with ECMA-262's meaning where it differs
    // from Python's: "." excludes every line terminator (\r \u2028 \u2029 too), \s is
    // ECMA's white space (Unicode's spaces too), "{,m}" is text; a top-level branch's "^" and
    // "$" anchor that branch.
    bool search = false;
    // Characters (code points) of the text (minLength, maxLength): the minimum is folded into
    // the automaton, the maximum held while matching against each state's distance to a match.
    int min_length = 0;
    int max_length = INT_MAX;
  };
  static constexpr int kMaxStates = 1 << 16;
  static constexpr int kMaxRepeat = 1000;

  // INVALID_ARGUMENT saying what is wrong and where ("at offset 4: ..."), or that the
  // pattern matches no text.
  static absl::StatusOr<std::shared_ptr<const Regex>> Compile(std::string_view pattern,
                                                              const Options& options);
  static absl::StatusOr<std::shared_ptr<const Regex>> Compile(std::string_view pattern) {
    return Compile(pattern, Options());
  }
  // The pattern matching exactly these texts (vLLM's guided_choice).
  static std::string Alternatives(const std::vector<std::string>& texts);

  // States are >= 0; -1 is dead. From every live state some text reaches a match.
  int32_t start() const { return 0; }
  int32_t Next(int32_t state, char32_t cp) const;
  bool Accepting(int32_t state) const { return accepting_[state] != 0; }
  // Some code point in [lo, hi] leads to a state within `budget` code points of a match.
  bool AnyNext(int32_t state, char32_t lo, char32_t hi, int64_t budget = INT64_MAX) const;
  // The fewest code points from `state` to a match.
  int32_t Distance(int32_t state) const { return dist_[state]; }
  // Code points a text of `count` so far may still take after the next one (maxLength).
  int64_t Budget(int32_t count) const { return int64_t{max_length_} - count - 1; }
  int num_states() const { return static_cast<int>(accepting_.size()); }
  // Entries of the transition table (states x character classes): its memory, in int32s.
  size_t table_size() const { return next_.size(); }

 private:
  int ClassOf(char32_t cp) const;

  std::vector<char32_t> bounds_;         // code point intervals [bounds_[i], bounds_[i + 1])
  std::vector<int32_t> interval_class_;  // the class of each interval
  int num_classes_ = 0;
  std::vector<int32_t> next_;  // state * num_classes_ + class -> state or -1
  std::vector<uint8_t> accepting_;
  std::vector<int32_t> dist_;  // per state: Distance
  int max_length_ = INT_MAX;   // Options::max_length, held at run time (Utf8Matcher)
  friend class RegexBuilder;
};

// Incremental UTF-8 decoding that checks each byte against a Regex: a byte is refused once
// no code point it could begin leads to a live state (overlong forms, surrogates and values
// past U+10FFFF included).
struct Utf8Matcher {
  int32_t state = 0;
  int32_t count = 0;   // code points so far
  uint32_t value = 0;  // the bits of the code point so far
  uint8_t left = 0;    // continuation bytes still to come
  uint8_t length = 0;  // bytes of the code point being read

  bool Byte(const Regex& re, unsigned char c);
  // One whole code point: its state, if a match within the maximum length can still follow.
  bool Step(const Regex& re, char32_t cp);
  bool Complete(const Regex& re) const { return left == 0 && state >= 0 && re.Accepting(state); }
};

// The whole output matches (vLLM's guided_regex, guided_choice). Copyable.
class RegexRecognizer {
 public:
  explicit RegexRecognizer(const Regex* re) : re_(re) {}
  bool Feed(std::string_view bytes) {
    for (unsigned char c : bytes) {
      if (!m_.Byte(*re_, c)) return false;
    }
    return true;
  }
  bool Complete() const { return m_.Complete(*re_); }

 private:
  const Regex* re_;
  Utf8Matcher m_;
};

// The body of a JSON string (after its opening quote) whose decoded text must match: raw
// UTF-8, escapes and \u escapes (a surrogate pair as one code point, lone surrogates refused)
// are decoded and checked as they come.
class JsonStringMatcher {
 public:
  enum class Step : uint8_t { kReject, kMore, kClosed };
  explicit JsonStringMatcher(const Regex* re = nullptr) : re_(re) {}
  Step Byte(unsigned char c);

 private:
  enum class Mode : uint8_t { kBody, kEscape, kHex, kHighSlash, kHighU, kLowHex };
  Step Take(unsigned char c);
  bool HexViable() const;

  const Regex* re_;
  Utf8Matcher m_;
  Mode mode_ = Mode::kBody;
  uint8_t digits_ = 0;  // hex digits read of the \u escape
  uint16_t unit_ = 0;   // the \u escape so far
  uint16_t high_ = 0;   // a high surrogate waiting for its low half
};

}  // namespace tinyserve
