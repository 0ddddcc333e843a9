// File: worker/sampling/number_range.cc
// Exact decimal arithmetic on digit strings. A number's reachable values are, by the shape of
// its prefix, a few grids: the multiples of 10^-k between two decimals. "12" with 4 more bytes
// reaches 12 and 12.d..., 12d and 12d.d, 12dd, 12ddd, 12dddd: one grid per count of further
// integer digits; "0.25" with 3 more bytes the multiples of 10^-5 in [0.25, 0.26). Whether a
// grid meets the range is one rounding and two comparisons, so no search is needed.
#include "worker/sampling/number_range.h"

#include <cctype>

namespace tinyserve {
namespace {

using Magnitude = NumberRange::Magnitude;

void Normalize(Magnitude* m) {
  const size_t lead = m->integer.find_first_not_of('0');
  m->integer.erase(0, lead == std::string::npos ? m->integer.size() : lead);
  const size_t trail = m->fraction.find_last_not_of('0');
  m->fraction.resize(trail == std::string::npos ? 0 : trail + 1);
}

int Compare(const Magnitude& a, const Magnitude& b) {
  if (a.integer.size() != b.integer.size()) return a.integer.size() < b.integer.size() ? -1 : 1;
  if (const int c = a.integer.compare(b.integer); c != 0) return c < 0 ? -1 : 1;
  const int c = a.fraction.compare(b.fraction);  // no trailing zeros: prefixes are smaller
  return c < 0 ? -1 : c > 0 ? 1 : 0;
}

bool IsZero(const Magnitude& m) { return m.integer.empty() && m.fraction.empty(); }

// x + 10^-k, for x with at most k fraction digits.
Magnitude AddUnit(const Magnitude& x, int k) {
  std::string fraction = x.fraction;
  fraction.resize(k, '0');
  std::string all = x.integer + fraction;
  int i = static_cast<int>(all.size()) - 1;
  while (i >= 0 && all[i] == '9') all[i--] = '0';
  if (i < 0) {
    all.insert(all.begin(), '1');
  } else {
    ++all[i];
  }
  Magnitude r{all.substr(0, all.size() - k), all.substr(all.size() - k)};
  Normalize(&r);
  return r;
}

// The least multiple of 10^-k that is >= x.
Magnitude CeilTo(Magnitude x, int k) {
  if (static_cast<int>(x.fraction.size()) <= k) return x;
  x.fraction.resize(k);  // the digits dropped were not all zero (no trailing zeros)
  Normalize(&x);
  return AddUnit(x, k);
}

struct Side {
  bool set = false, exclusive = false;
  Magnitude value;
};
struct MagnitudeRange {
  bool empty = false;
  Side lo, hi;
};

// Some multiple of 10^-k in [a, b) ([a, b] when b_inclusive), a itself one, lies in r.
bool GridMeets(const Magnitude& a, const Magnitude& b, bool b_inclusive, int k,
               const MagnitudeRange& r) {
  Magnitude x = a;
  if (r.lo.set) {
    const int c = Compare(r.lo.value, x);
    if (c > 0 || (c == 0 && r.lo.exclusive)) {
      x = CeilTo(r.lo.value, k);
      if (r.lo.exclusive && Compare(x, r.lo.value) == 0) x = AddUnit(x, k);
    }
  }
  const int cb = Compare(x, b);
  if (b_inclusive ? cb > 0 : cb >= 0) return false;
  if (r.hi.set) {
    const int ch = Compare(x, r.hi.value);
    if (ch > 0 || (ch == 0 && r.hi.exclusive)) return false;
  }
  return true;
}

// Whether a magnitude written as `body` (digits and '.') and at most `more` further bytes can
// lie in r.
bool MagnitudeReachable(std::string_view body, int more, const MagnitudeRange& r) {
  if (body.empty()) {  // after a minus sign: a digit must come
    if (more < 1) return false;
    for (char d = '0'; d <= '9'; ++d) {
      if (MagnitudeReachable(std::string_view(&d, 1), more - 1, r)) return true;
    }
    return false;
  }
  const size_t dot = body.find('.');
  if (dot == std::string_view::npos) {
    if (body == "0") {  // 0, or 0.d... with at most more - 1 fraction digits
      if (more < 2) return GridMeets({}, {}, /*b_inclusive=*/true, 0, r);
      return GridMeets({}, {"1", ""}, /*b_inclusive=*/false, more - 1, r);
    }
    Magnitude a{std::string(body), ""};
    Magnitude b = AddUnit(a, 0);
    for (int m = 0; m <= more; ++m) {  // m further integer digits
      const int left = more - m;       // then '.' and left - 1 fraction digits
      if (GridMeets(a, b, /*b_inclusive=*/false, left >= 2 ? left - 1 : 0, r)) return true;
      if (r.hi.set && Compare(a, r.hi.value) > 0) break;  // more digits only go higher
      a.integer += '0';
      b.integer += '0';
    }
    return false;
  }
  Magnitude a{std::string(body.substr(0, dot)), std::string(body.substr(dot + 1))};
  const int digits = static_cast<int>(a.fraction.size());
  Normalize(&a);
  if (digits == 0) {  // "12.": a digit must come
    if (more < 1) return false;
    return GridMeets(a, AddUnit(a, 0), /*b_inclusive=*/false, more, r);
  }
  return GridMeets(a, AddUnit(a, digits), /*b_inclusive=*/false, digits + more, r);
}

bool ParseDecimal(std::string_view text, bool* negative, Magnitude* out) {
  size_t i = 0;
  *negative = i < text.size() && text[i] == '-';
  if (*negative) ++i;
  std::string digits;
  int point = -1;
  for (; i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.');
       ++i) {
    if (text[i] == '.') {
      if (point >= 0) return false;
      point = static_cast<int>(digits.size());
    } else {
      digits += text[i];
    }
  }
  if (digits.empty()) return false;
  if (point < 0) point = static_cast<int>(digits.size());
  if (i < text.size()) {
    if (text[i] != 'e' && text[i] != 'E') return false;
    ++i;
    const bool down = i < text.size() && text[i] == '-';
    if (i < text.size() && (text[i] == '-' || text[i] == '+')) ++i;
    int exponent = 0;
    if (i == text.size()) return false;
    for (; i < text.size(); ++i) {
      if (!std::isdigit(static_cast<unsigned char>(text[i])) || exponent > 1000) return false;
      exponent = exponent * 10 + (text[i] - '0');
    }
    point += down ? -exponent : exponent;
  }
  if (point <= 0) {
    *out = {"", std::string(-point, '0') + digits};
  } else if (point >= static_cast<int>(digits.size())) {
    *out = {digits + std::string(point - digits.size(), '0'), ""};
  } else {
    *out = {digits.substr(0, point), digits.substr(point)};
  }
  Normalize(out);
  return true;
}

}  // namespace

bool NumberRange::Set(std::string_view text, bool exclusive, bool lower) {
  Bound b;
  b.set = true;
  b.exclusive = exclusive;
  if (!ParseDecimal(text, &b.negative, &b.value)) return false;
  if (IsZero(b.value)) b.negative = false;
  Bound& side = lower ? lower_ : upper_;
  if (side.set) {  // keep the stricter
    int c = b.negative != side.negative ? (b.negative ? -1 : 1)
                                        : (b.negative ? -1 : 1) * Compare(b.value, side.value);
    if (!lower) c = -c;  // for an upper bound, smaller is stricter
    if (c < 0 || (c == 0 && !b.exclusive)) return true;
  }
  side = b;
  return true;
}

bool NumberRange::SetLower(std::string_view text, bool exclusive) {
  return Set(text, exclusive, /*lower=*/true);
}
bool NumberRange::SetUpper(std::string_view text, bool exclusive) {
  return Set(text, exclusive, /*lower=*/false);
}

bool NumberRange::Reachable(std::string_view prefix, int more) const {
  const bool negative = !prefix.empty() && prefix[0] == '-';
  // The magnitudes M for which +M (or -M) lies within the bounds.
  MagnitudeRange r;
  if (lower_.set) {
    const bool zero = IsZero(lower_.value);
    if (!negative) {  // M >= lo (nothing to hold when lo < 0, or lo = 0 inclusive)
      if (zero ? lower_.exclusive : !lower_.negative) {
        r.lo = {true, lower_.exclusive, lower_.value};
      }
    } else if (zero ? lower_.exclusive : !lower_.negative) {  // -M >= lo: M <= -lo
      r.empty = true;
    } else {
      r.hi = {true, lower_.exclusive, lower_.value};
    }
  }
  if (upper_.set) {
    const bool zero = IsZero(upper_.value);
    if (!negative) {  // M <= hi
      if (zero ? upper_.exclusive : upper_.negative) {
        r.empty = true;
      } else {
        r.hi = {true, upper_.exclusive, upper_.value};
      }
    } else if (zero ? upper_.exclusive : upper_.negative) {  // -M <= hi: M >= -hi
      r.lo = {true, upper_.exclusive, upper_.value};
    }
  }
  if (r.empty) return false;
  return MagnitudeReachable(prefix.substr(negative ? 1 : 0), more, r);
}

}  // namespace tinyserve
