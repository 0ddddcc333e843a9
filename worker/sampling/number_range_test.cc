// File: worker/sampling/number_range_test.cc
// NumberRange against brute force: every JSON number of up to 5 bytes (no exponent) is judged
// with exact rational arithmetic (an independent implementation), and every prefix of one must
// be Reachable exactly when some number in range of at most 5 bytes extends it.
#include "worker/sampling/number_range.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace tinyserve {
namespace {

// value = num / 10^scale
struct Rational {
  __int128 num = 0;
  int scale = 0;
};

Rational Parse(const std::string& t) {
  Rational r;
  bool neg = false, frac = false;
  for (char c : t) {
    if (c == '-') {
      neg = true;
    } else if (c == '.') {
      frac = true;
    } else {
      r.num = r.num * 10 + (c - '0');
      if (frac) ++r.scale;
    }
  }
  if (neg) r.num = -r.num;
  return r;
}

int Cmp(const Rational& a, const Rational& b) {
  __int128 x = a.num, y = b.num;
  for (int i = a.scale; i < b.scale; ++i) x *= 10;
  for (int i = b.scale; i < a.scale; ++i) y *= 10;
  return x < y ? -1 : x > y ? 1 : 0;
}

// All JSON numbers (no exponent) of at most n bytes.
void Numbers(const std::string& t, int n, std::vector<std::string>* out) {
  // t is a valid prefix; emit it when complete and extend it.
  const bool complete = !t.empty() && t.back() != '-' && t.back() != '.';
  if (complete) out->push_back(t);
  if (static_cast<int>(t.size()) == n) return;
  const std::string body = t.substr(!t.empty() && t[0] == '-' ? 1 : 0);
  const bool has_dot = body.find('.') != std::string::npos;
  if (t.empty()) Numbers("-", n, out);
  if (body == "0") {
    Numbers(t + ".", n, out);
    return;
  }
  for (char d = '0'; d <= '9'; ++d) Numbers(t + d, n, out);
  if (!body.empty() && !has_dot) Numbers(t + ".", n, out);
}

struct Case {
  const char* lo;
  bool lo_ex;
  const char* hi;
  bool hi_ex;
};

TEST(NumberRange, AgreesWithBruteForceOnEveryShortNumber) {
  constexpr int kBytes = 5;
  std::vector<std::string> numbers;
  Numbers("", kBytes, &numbers);
  ASSERT_GT(numbers.size(), 10000u);
  const Case cases[] = {
      {"0.1", false, nullptr, false},   {nullptr, false, "0.1", true},
      {"0", true, "1", false},          {"-2.5", false, "-0.25", true},
      {"0", false, "0", false},         {"-0.001", true, "0.001", true},
      {"10", false, "99", false},       {"1e-3", false, "2e-3", false},
      {"-1", false, "1", false},        {"0.05", true, "0.051", false},
      {"-100", false, nullptr, false},  {nullptr, false, "-3", false},
      {"9.99", false, "10.01", true},   {"0.3", true, "0.7", true},
      {"12345", false, "12346", false}, {"0.001", false, "0.002", true},
      {"1e4", false, nullptr, false},   {"-0", true, "0.5e1", false},
  };
  for (const Case& c : cases) {
    NumberRange range;
    if (c.lo) {
      ASSERT_TRUE(range.SetLower(c.lo, c.lo_ex));
    }
    if (c.hi) {
      ASSERT_TRUE(range.SetUpper(c.hi, c.hi_ex));
    }
    auto exact = [&](const char* s) {
      // The bound's exact value, from its own text (exponents spelled out for this parser).
      std::string t = s;
      if (t == "1e-3") t = "0.001";
      if (t == "2e-3") t = "0.002";
      if (t == "1e4") t = "10000";
      if (t == "-0") t = "0";
      if (t == "0.5e1") t = "5";
      return Parse(t);
    };
    std::set<std::string> reachable;  // prefixes of numbers in range
    int inside = 0;
    for (const std::string& t : numbers) {
      const Rational v = Parse(t);
      bool in = true;
      if (c.lo) in = in && (c.lo_ex ? Cmp(v, exact(c.lo)) > 0 : Cmp(v, exact(c.lo)) >= 0);
      if (c.hi) in = in && (c.hi_ex ? Cmp(v, exact(c.hi)) < 0 : Cmp(v, exact(c.hi)) <= 0);
      ASSERT_EQ(range.Contains(t), in)
          << t << " in [" << (c.lo ? c.lo : "") << ", " << (c.hi ? c.hi : "") << "]";
      if (in) {
        ++inside;
        for (size_t k = 1; k <= t.size(); ++k) reachable.insert(t.substr(0, k));
      }
    }
    // Every valid prefix: the numbers themselves and their incomplete prefixes.
    std::set<std::string> prefixes;
    for (const std::string& t : numbers) {
      for (size_t k = 1; k <= t.size(); ++k) prefixes.insert(t.substr(0, k));
    }
    for (const std::string& p : prefixes) {
      ASSERT_EQ(range.Reachable(p, kBytes - static_cast<int>(p.size())), reachable.count(p) > 0)
          << "prefix " << p << " in [" << (c.lo ? c.lo : "") << ", " << (c.hi ? c.hi : "") << "]";
    }
    EXPECT_GT(inside, 0) << (c.lo ? c.lo : "") << " " << (c.hi ? c.hi : "");
  }
}

TEST(NumberRange, DecimalBoundsAreExact) {
  NumberRange r;
  ASSERT_TRUE(r.SetLower("0.1", false));
  EXPECT_TRUE(r.Contains("0.1"));  // 0.1 is 0.1, not the double just above it
  EXPECT_FALSE(r.Contains("0.09999999999999999999"));
  NumberRange x;
  ASSERT_TRUE(x.SetUpper("0.3", true));
  EXPECT_FALSE(x.Contains("0.3"));
  EXPECT_TRUE(x.Contains("0.29999999999999999999"));
  // The stricter of two bounds on a side stays.
  NumberRange two;
  ASSERT_TRUE(two.SetLower("1", false));
  ASSERT_TRUE(two.SetLower("1", true));
  ASSERT_TRUE(two.SetLower("0.5", false));
  EXPECT_FALSE(two.Contains("1"));
  EXPECT_TRUE(two.Contains("1.0001"));
  // Huge and tiny bounds, as a double's shortest text writes them.
  NumberRange big;
  ASSERT_TRUE(big.SetLower("1e+300", false));
  EXPECT_FALSE(big.Reachable("9", 31));  // 32 bytes hold no number that large
  NumberRange tiny;
  ASSERT_TRUE(tiny.SetLower("0", true));
  ASSERT_TRUE(tiny.SetUpper("1e-40", false));
  EXPECT_FALSE(tiny.Reachable("0", 31));  // 0.000...1 with 40 zeros needs 42 bytes
  NumberRange small;
  ASSERT_TRUE(small.SetLower("0", true));
  ASSERT_TRUE(small.SetUpper("1e-29", false));
  EXPECT_TRUE(small.Reachable("0", 30));  // ".", 28 zeros and a 1: 30 bytes more
  EXPECT_FALSE(small.Reachable("0", 29));
  EXPECT_FALSE(small.Reachable("-", 31));
  EXPECT_FALSE(r.SetLower("abc", false));
  EXPECT_FALSE(r.SetLower("1e", false));
}

}  // namespace
}  // namespace tinyserve
