// File: worker/sampling/number_range.h
// A JSON Schema number's bounds (minimum, maximum, exclusiveMinimum, exclusiveMaximum), held
// exactly as decimals, and the question constrained decoding asks of them byte by byte: can a
// number that starts with these bytes, within the bytes still allowed, end inside the range?
// Numbers are plain decimals here (-?(0|[1-9][0-9]*)(\.[0-9]+)?, no exponent), so a bound like
// 0.1 compares as the decimal 0.1, not as the double nearest it.
//
// Thread safety: immutable once built.
#pragma once

#include <string>
#include <string_view>

namespace tinyserve {

class NumberRange {
 public:
  // text: a decimal, optionally with an exponent ("0.1", "-3", "1e-05", "2.5e+300"), as the
  // shortest round-trip form of the schema's number. A second bound on a side keeps the
  // stricter. False when text is not a number.
  bool SetLower(std::string_view text, bool exclusive);
  bool SetUpper(std::string_view text, bool exclusive);
  bool bounded() const { return lower_.set || upper_.set; }

  // prefix: the start of a JSON number without exponent ("-", "0", "12.", "-3.25"); more: the
  // bytes that may still follow. Whether some number so completed lies within the range.
  bool Reachable(std::string_view prefix, int more) const;
  // A whole number (no exponent) lies within the range.
  bool Contains(std::string_view number) const { return Reachable(number, 0); }

  // A non-negative decimal: integer digits without leading zeros ("" for 0), fraction digits
  // without trailing zeros.
  struct Magnitude {
    std::string integer, fraction;
  };

 private:
  struct Bound {
    bool set = false, exclusive = false, negative = false;
    Magnitude value;
  };
  bool Set(std::string_view text, bool exclusive, bool lower);

  Bound lower_, upper_;
};

}  // namespace tinyserve
