// File: worker/sampling/regex_test.cc
// The regex DFA against the `regex` package (tests/golden/regex/regex_cases.json, made by
// scripts/make_regex_goldens.py): every text's viability and match, whole-match and search
// (JSON Schema "pattern", through JsonStringMatcher on the text as a JSON string); no dead
// ends; errors; the guided_choice pattern.
#include "worker/sampling/regex.h"

#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tinyserve {
namespace {

using json = nlohmann::json;

std::shared_ptr<const Regex> MustCompile(std::string_view p, Regex::Options o = {}) {
  auto re = Regex::Compile(p, o);
  EXPECT_TRUE(re.ok()) << p << ": " << re.status();
  return re.ok() ? *re : nullptr;
}

bool Viable(const Regex& re, std::string_view text) { return RegexRecognizer(&re).Feed(text); }
bool Matches(const Regex& re, std::string_view text) {
  RegexRecognizer r(&re);
  return r.Feed(text) && r.Complete();
}

// The JSON string text (quotes included): -1 refused partway, 0 read but not closed, 1 closed
// with the last byte.
int JsonString(const Regex& re, std::string_view text) {
  if (text.empty() || text[0] != '"') return -1;
  JsonStringMatcher m(&re);
  for (size_t i = 1; i < text.size(); ++i) {
    switch (m.Byte(static_cast<unsigned char>(text[i]))) {
      case JsonStringMatcher::Step::kReject:
        return -1;
      case JsonStringMatcher::Step::kClosed:
        return i + 1 == text.size() ? 1 : -1;
      case JsonStringMatcher::Step::kMore:
        break;
    }
  }
  return 0;
}

// Some text of at most `depth` more characters from `alphabet` completes a match.
bool Completes(const RegexRecognizer& r, const std::vector<std::string>& alphabet, int depth) {
  if (r.Complete()) return true;
  if (depth == 0) return false;
  for (const std::string& c : alphabet) {
    RegexRecognizer next = r;
    if (next.Feed(c) && Completes(next, alphabet, depth - 1)) return true;
  }
  return false;
}

// Every text of at most `depth` characters from `alphabet` that the recognizer accepts can be
// completed; the count of such texts.
int CheckNoDeadEnds(const RegexRecognizer& r, const std::vector<std::string>& alphabet, int depth,
                    int completion_depth, const std::string& what) {
  EXPECT_TRUE(Completes(r, alphabet, completion_depth)) << what;
  if (depth == 0) return 1;
  int n = 1;
  for (const std::string& c : alphabet) {
    RegexRecognizer next = r;
    if (next.Feed(c)) n += CheckNoDeadEnds(next, alphabet, depth - 1, completion_depth, what + c);
  }
  return n;
}

TEST(RegexGolden, MatchesTheRegexPackage) {
  std::ifstream in("tests/golden/regex/regex_cases.json");
  ASSERT_TRUE(in) << "tests/golden/regex/regex_cases.json (run from the repository root)";
  std::stringstream text;
  text << in.rdbuf();
  const json golden = json::parse(text.str());
  int texts = 0, json_texts = 0;
  for (const json& g : golden["groups"]) {
    const std::string pattern = g["pattern"];
    Regex::Options o;
    o.search = g.value("search", false);
    o.min_length = g.value("min_length", 0);
    const int max = g.value("max_length", -1);
    if (max >= 0) o.max_length = max;
    auto re = MustCompile(pattern, o);
    ASSERT_NE(re, nullptr);
    for (const json& c : g["cases"]) {
      const std::string t = c[0];
      const bool full = c[2];
      SCOPED_TRACE(testing::Message() << "pattern " << pattern << " text '" << t << "'");
      if (!c[1].is_null()) {
        EXPECT_EQ(Viable(*re, t), c[1].get<bool>());
      }
      EXPECT_EQ(Matches(*re, t), full);
      if (c.size() > 3) {  // the text as a JSON string, escaped or not
        const std::string js = c[3];
        EXPECT_EQ(JsonString(*re, js) == 1, full) << js;
        const bool open = JsonString(*re, js.substr(0, js.size() - 1)) == 0;
        if (!c[1].is_null()) {
          EXPECT_EQ(open, c[1].get<bool>()) << js;
        } else if (full) {
          EXPECT_TRUE(open) << js;
        }
        ++json_texts;
      }
      ++texts;
    }
  }
  EXPECT_GT(texts, 5000);
  EXPECT_GT(json_texts, 1000);
}

TEST(Regex, EveryAcceptedTextCompletes) {
  // With length bounds: each accepted text can still be completed within them.
  const std::vector<std::string> alphabet = {"a", "b", "x", "z", "0", "5", "-", " ", "\xC3\xA9"};
  struct Case {
    const char* pattern;
    int min, max;
  } cases[] = {{"^[a-z]+$", 2, 4}, {"\\d", 0, 3},     {"^x*$", 3, INT_MAX},
               {"a|b0", 1, 2},     {"^(ab)+$", 0, 5}, {"[0-9]{2}-", 3, 6}};
  for (const Case& c : cases) {
    Regex::Options o;
    o.search = true;
    o.min_length = c.min;
    o.max_length = c.max;
    auto re = MustCompile(c.pattern, o);
    ASSERT_NE(re, nullptr);
    EXPECT_GT(
        CheckNoDeadEnds(RegexRecognizer(re.get()), alphabet, 5, 8, std::string(c.pattern) + ": "),
        3);
  }
  // A long maxLength is held by distance, not by a product automaton.
  Regex::Options wide;
  wide.search = true;
  wide.max_length = 65536;
  auto base64 = MustCompile("^[A-Za-z0-9+/]*={0,2}$", wide);
  ASSERT_NE(base64, nullptr);
  EXPECT_LT(base64->num_states(), 10);
  wide.max_length = 3;
  auto four = MustCompile("^(?:[a-z]{2}|[a-z]{4})$", wide);
  ASSERT_NE(four, nullptr);
  EXPECT_TRUE(Viable(*four, "ab"));
  EXPECT_TRUE(Matches(*four, "ab"));
  EXPECT_FALSE(Viable(*four, "abc"));  // only the 4-letter branch goes on, past the maximum
  // ^(ab)+$ within 5 characters: "ababa" cannot be finished, so the fifth character is refused.
  Regex::Options o;
  o.search = true;
  o.max_length = 5;
  auto re = MustCompile("^(ab)+$", o);
  EXPECT_TRUE(Viable(*re, "abab"));
  EXPECT_FALSE(Viable(*re, "ababa"));
  EXPECT_TRUE(Matches(*re, "abab"));
}

TEST(Regex, Utf8IsCheckedByteByByte) {
  auto re = MustCompile("[\\u00e9\\u4e2d]+");
  EXPECT_TRUE(Viable(*re, "\xC3"));       // é's first byte
  EXPECT_FALSE(Viable(*re, "\xC3\xA8"));  // è
  EXPECT_FALSE(Viable(*re, "\xC4"));      // U+0100..U+013F: none allowed
  EXPECT_TRUE(Viable(*re, "\xE4\xB8"));   // 中 so far
  EXPECT_FALSE(Viable(*re, "\xE4\xB9"));
  EXPECT_FALSE(Viable(*re, "\xC0\xA9"));  // overlong
  auto any = MustCompile("[\\s\\S]*");
  EXPECT_FALSE(Viable(*any, "\xED\xA0\x80"));      // a surrogate
  EXPECT_FALSE(Viable(*any, "\xF4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(Viable(*any, "\x80"));              // a stray continuation
  EXPECT_TRUE(Matches(*any, "\xF0\x9F\x98\x80"));  // 😀
  RegexRecognizer half(any.get());
  ASSERT_TRUE(half.Feed("\xF0\x9F"));
  EXPECT_FALSE(half.Complete());  // a code point cut in two is not a match
}

TEST(Regex, JsonEscapesAndSurrogatePairs) {
  Regex::Options o;
  o.search = true;
  auto emoji = MustCompile("^\\U0001F600$", o);
  EXPECT_EQ(JsonString(*emoji, "\"\\ud83d\\ude00\""), 1);
  EXPECT_EQ(JsonString(*emoji, "\"\\uD83D\\uDE00\""), 1);
  EXPECT_EQ(JsonString(*emoji, "\"\\ud83d\\ude01"), -1);  // refused at its last digit
  EXPECT_EQ(JsonString(*emoji, "\"\\ud83c"), -1);         // no low half makes 😀
  EXPECT_EQ(JsonString(*emoji, "\"\\ud83d\""), -1);       // a lone high surrogate
  auto any = MustCompile("", o);
  EXPECT_EQ(JsonString(*any, "\"\\udc00"), -1);  // a lone low surrogate
  EXPECT_EQ(JsonString(*any, "\"a\\n\\\"\\/\\\\\""), 1);
  EXPECT_EQ(JsonString(*any, "\"\\x\""), -1);
  EXPECT_EQ(JsonString(*any, "\"\n\""), -1);  // a raw control character
  auto quote = MustCompile("^a\"b\\\\$", o);
  EXPECT_EQ(JsonString(*quote, "\"a\\\"b\\\\\""), 1);
  EXPECT_EQ(JsonString(*quote, "\"a\\u0022b\\u005c\""), 1);
  EXPECT_EQ(JsonString(*quote, "\"a\\u0023"), -1);
  // An accepting state with nowhere to go: the closing quote only.
  auto abc = MustCompile("^abc$", o);
  EXPECT_EQ(JsonString(*abc, "\"abc\\"), -1);
  EXPECT_EQ(JsonString(*abc, "\"abc\""), 1);
  // Refused once, refused after: a later byte that would fit does not revive it.
  JsonStringMatcher m(abc.get());
  EXPECT_EQ(m.Byte('x'), JsonStringMatcher::Step::kReject);
  EXPECT_EQ(m.Byte('a'), JsonStringMatcher::Step::kReject);
  JsonStringMatcher q(abc.get());
  EXPECT_EQ(q.Byte('a'), JsonStringMatcher::Step::kMore);
  EXPECT_EQ(q.Byte('"'), JsonStringMatcher::Step::kReject);  // not a match yet
  EXPECT_EQ(q.Byte('b'), JsonStringMatcher::Step::kReject);
}

TEST(Regex, ErrorsSayWhatAndWhere) {
  struct Case {
    const char* pattern;
    const char* message;
  } cases[] = {
      {"(a", "unterminated group"},
      {"a)", "unbalanced parenthesis"},
      {"*a", "nothing to repeat"},
      {"a**", "multiple repeat"},
      {"a++", "multiple repeat"},
      {"(a)\\1", "backreferences"},
      {"(?=a)", "lookaround"},
      {"(?<!a)b", "lookaround"},
      {"(?i)a", "inline flags"},
      {"a\\bb", "word boundaries"},
      {"a^b", "anchors"},
      {"[a", "unterminated character set"},
      {"[z-a]", "bad character range"},
      {"[\\d-z]", "bad character range"},
      {"a{5,2}", "min repeat greater than max repeat"},
      {"a{1001}", "repeat counts above 1000"},
      {"\\q", "bad escape"},
      {"\\x4", "hex digits"},
      {"[^\\s\\S]", "matches no text"},
      {"(a{1000}){1000}", "too complex"},
      {"[ab]*a[ab]{16}", "too complex"},        // 2^17 states
      {"(?:(?:.?){1000}){90}", "too complex"},  // bounded by building steps, not only states
      {"\\ud83d", "lone surrogate"},
      {"\\ude00\\ud83d", "lone surrogate"},
      {"[\\ud800-\\udfff]", "lone surrogate"},
      {"a|b^", "anchors"},
      {"(^a)", "anchors"},
      {"((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((a)))))))))))))))))))"
       ")))))))))))))))))))))))))))))))))))))))))))))))",
       "nested too deeply"},
  };
  for (const Case& c : cases) {
    auto re = Regex::Compile(c.pattern);
    ASSERT_FALSE(re.ok()) << c.pattern;
    EXPECT_EQ(re.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(re.status().message().find(c.message), std::string::npos)
        << c.pattern << ": " << re.status();
  }
  EXPECT_NE(Regex::Compile("a)").status().message().find("at offset 1"), std::string::npos);
  Regex::Options o;
  o.search = true;
  o.min_length = 3;
  o.max_length = 2;
  EXPECT_FALSE(Regex::Compile("a", o).ok());
  o.min_length = 0;
  o.max_length = 2;
  auto three = Regex::Compile("^\\d{3}$", o);
  ASSERT_FALSE(three.ok());
  EXPECT_NE(three.status().message().find("length bounds"), std::string::npos);
  // {n} with a quantifier-shaped brace that is not one stays a literal, as in Python.
  auto brace = MustCompile("a{x}");
  EXPECT_TRUE(Matches(*brace, "a{x}"));
}

TEST(Regex, AlternativesMatchExactlyTheTexts) {
  const std::vector<std::string> texts = {"yes", "no", "maybe (later)", "a.b*c", "x\ny", "", "é|$"};
  auto re = MustCompile(Regex::Alternatives(texts));
  for (const std::string& t : texts) EXPECT_TRUE(Matches(*re, t)) << t;
  EXPECT_FALSE(Matches(*re, "ye"));
  EXPECT_FALSE(Matches(*re, "yesno"));
  EXPECT_FALSE(Matches(*re, "aXb*c"));
  EXPECT_FALSE(Matches(*re, "\xC3\xA9"));
  EXPECT_TRUE(Viable(*re, "may"));
  EXPECT_FALSE(Viable(*re, "mab"));
}

// A classifier's label set: 2,048 texts of 30 characters (a trie of about 55,000 states) compile,
// and the automaton takes exactly them.
TEST(Regex, ThousandsOfAlternativesCompile) {
  std::mt19937 rng(3);
  const std::string letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ";
  std::vector<std::string> texts(2048);
  for (std::string& t : texts) {
    for (int k = 0; k < 30; ++k) t += letters[rng() % letters.size()];
  }
  auto re = MustCompile(Regex::Alternatives(texts));
  EXPECT_GT(re->num_states(), 20000);
  for (const std::string& t : texts) EXPECT_TRUE(Matches(*re, t)) << t;
  std::string near = texts[7];
  near.back() = near.back() == 'a' ? 'b' : 'a';
  EXPECT_FALSE(Matches(*re, near));
  EXPECT_FALSE(Matches(*re, texts[7].substr(0, 29)));
}

}  // namespace
}  // namespace tinyserve
