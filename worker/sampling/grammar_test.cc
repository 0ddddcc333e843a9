#include "worker/sampling/grammar.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tinyserve {
namespace {

// Tokens: the 256 single bytes (ids 0..255), then `extra` strings, then one special token and
// one end-of-generation token.
std::shared_ptr<TokenTable> Table(const std::vector<std::string>& extra = {}) {
  auto t = std::make_shared<TokenTable>();
  for (int b = 0; b < 256; ++b) {
    t->bytes.push_back(std::string(1, static_cast<char>(b)));
    t->kind.push_back(TokenTable::kNormal);
  }
  for (const std::string& s : extra) {
    t->bytes.push_back(s);
    t->kind.push_back(TokenTable::kNormal);
  }
  t->bytes.push_back("<|im_start|>");
  t->kind.push_back(TokenTable::kSpecial);
  t->bytes.push_back("");
  t->kind.push_back(TokenTable::kEnd);
  t->Index();
  return t;
}

std::shared_ptr<const Grammar> Compiled(std::string_view text) {
  auto g = Grammar::Compile(text);
  EXPECT_TRUE(g.ok()) << g.status() << "\n" << text;
  return g.ok() ? *g : nullptr;
}

// Feeds `text` byte by byte: -1 when every byte is allowed and the grammar may end there, -2
// when every byte is allowed but it may not end, else the offset of the first refused byte.
int Feed(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  static const auto table = Table();
  GrammarConstraint c(table, g);
  std::vector<uint8_t> all;
  for (size_t i = 0; i < text.size(); ++i) {
    const int32_t id = static_cast<unsigned char>(text[i]);
    c.AllowedTokens(static_cast<int>(table->kind.size()), &all);
    EXPECT_EQ(all[id], c.Allows(id)) << i;
    if (!c.Allows(id)) return static_cast<int>(i);
    c.Accept(id);
  }
  const int32_t eog = static_cast<int32_t>(table->kind.size()) - 1;
  EXPECT_EQ(c.Allows(eog), c.Complete());
  return c.Complete() ? -1 : -2;
}

std::string ErrorOf(std::string_view text) {
  auto g = Grammar::Compile(text);
  return g.ok() ? "" : std::string(g.status().message());
}

TEST(Grammar, LiteralsClassesAndAlternatives) {
  auto g = Compiled(R"g(root ::= "yes" | "no" | answer
answer ::= [A-Z] [a-z]+ ("." | "!")?  # a capitalised word
)g");
  EXPECT_EQ(Feed(g, "yes"), -1);
  EXPECT_EQ(Feed(g, "no"), -1);
  EXPECT_EQ(Feed(g, "Maybe"), -1);
  EXPECT_EQ(Feed(g, "Maybe!"), -1);
  EXPECT_EQ(Feed(g, "ye"), -2);
  EXPECT_EQ(Feed(g, "M"), -2);  // [a-z]+ needs one letter
  EXPECT_EQ(Feed(g, "yes!"), 3);
  EXPECT_EQ(Feed(g, "maybe"), 0);
  EXPECT_EQ(Feed(g, "Maybe!!"), 6);
  EXPECT_EQ(Feed(g, ""), -2);
}

TEST(Grammar, RepetitionCounts) {
  auto g = Compiled(R"g(root ::= "a"{2,4} "b"{3} "c"{1,} "d"{0,2} "e"? )g");
  EXPECT_EQ(Feed(g, "aabbbc"), -1);
  EXPECT_EQ(Feed(g, "aaaabbbcccdde"), -1);
  EXPECT_EQ(Feed(g, "abbbc"), 1);
  EXPECT_EQ(Feed(g, "aaaaa"), 4);
  EXPECT_EQ(Feed(g, "aabbbb"), 5);
  EXPECT_EQ(Feed(g, "aabbbcddd"), 8);
  EXPECT_EQ(Feed(g, "aabbb"), -2);
  // A literal repeats as a whole; a group too.
  auto h = Compiled(R"g(root ::= "ab"* ("x" | "yz"){2})g");
  EXPECT_EQ(Feed(h, "ababxyz"), -1);
  EXPECT_EQ(Feed(h, "abaxx"), 3);
  EXPECT_EQ(Feed(h, "yzx"), -1);
  EXPECT_EQ(Feed(h, "x"), -2);
}

TEST(Grammar, EscapesNegationAnyAndUnicode) {
  auto g =
      Compiled(R"g(root ::= "\"" [^"\\\x00-\x1F]* "\"" "\n" [\u00e0-\u00ff\-]+ . "\U0001F600")g");
  EXPECT_EQ(Feed(g, "\"a b 字\"\n\xC3\xA9-x\xF0\x9F\x98\x80"), -1);  // é, -, any, 😀
  EXPECT_EQ(Feed(g, "\"a\\"), 2);
  EXPECT_EQ(Feed(g, "\"a\tb"), 2);  // \t is below \x20
  EXPECT_EQ(Feed(g, "\"\"\nz"), 3);
  // Invalid UTF-8 is refused at the byte that breaks it; an overlong form too.
  auto any = Compiled("root ::= .*");
  EXPECT_EQ(Feed(any, "ok \xE5\xAD\x97"), -1);
  EXPECT_EQ(Feed(any, "\xE5\x41"), 1);
  EXPECT_EQ(Feed(any, "\xC0\x80"), 0);  // C0 only starts overlong forms
  EXPECT_EQ(Feed(any, "\xFF"), 0);
  EXPECT_EQ(Feed(any, "\xE5\xAD"), -2);  // the code point is not whole yet
}

TEST(Grammar, NewlinesCommentsAndNesting) {
  auto g = Compiled(R"g(# a list of items
root ::= (
    "- " item   # first
    ("\n- " item)*
  )
item ::= [a-z]+ |
  "(" item ( "," item )* ")"
)g");
  EXPECT_EQ(Feed(g, "- a\n- (b,(c,d))"), -1);
  EXPECT_EQ(Feed(g, "- (b,"), -2);
  EXPECT_EQ(Feed(g, "- ()"), 3);
}

TEST(Grammar, TokensSpanCodePointsAndEndOfGenerationWaitsForTheEnd) {
  // Token 256: "\xE5" + half of another character; 257: "\xAD\x97" (completes 字).
  auto table = Table({"ab", "\xE5", "\xAD\x97", "abc", "\xE4"});
  auto g = Compiled(R"g(root ::= "ab" "字"+)g");
  GrammarConstraint c(table, g);
  const int32_t special = static_cast<int32_t>(table->kind.size()) - 2;
  const int32_t eog = special + 1;
  EXPECT_TRUE(c.Allows(256));
  EXPECT_FALSE(c.Allows(259));  // "abc": c is not 字
  EXPECT_FALSE(c.Allows(special));
  EXPECT_FALSE(c.Allows(eog));
  c.Accept(256);
  EXPECT_TRUE(c.Allows(257));   // the first byte of 字 (E5 AD 97)
  EXPECT_FALSE(c.Allows(260));  // E4 starts characters below 字's
  c.Accept(257);
  EXPECT_FALSE(c.Allows(eog));  // half a character
  EXPECT_TRUE(c.Allows(258));
  c.Accept(258);
  EXPECT_TRUE(c.Allows(eog));
  EXPECT_TRUE(c.Complete());
  EXPECT_TRUE(c.Allows(257));  // another 字 may follow
}

TEST(Grammar, AlternativesThatCannotFinishAreDropped) {
  auto g = Compiled(R"g(root ::= "a" | "b" loop
loop ::= "c" loop)g");
  EXPECT_EQ(Feed(g, "a"), -1);
  EXPECT_EQ(Feed(g, "b"), 0);  // would be a dead end
  EXPECT_TRUE(absl::StrContains(ErrorOf("root ::= loop\nloop ::= \"c\" loop"), "matches no text"));
  // Nor can a surrogate, which no UTF-8 text holds.
  EXPECT_TRUE(absl::StrContains(ErrorOf(R"g(root ::= [\uD800-\uDFFF])g"), "surrogate"));
}

TEST(Grammar, AmbiguityIsMergedAndCapped) {
  auto g = Compiled(R"g(root ::= ("a" | "a" | [a-b])* "b")g");
  EXPECT_EQ(Feed(g, std::string(200, 'a') + "b"), -1);
  // Each 'a' doubles the parses (their continuations differ): past kMaxPerParse open they are
  // matched together again, and the code point that would pass kMaxStacks is refused.
  auto h = Compiled(R"g(root ::= x
x ::= "a" x "b" | "a" x "c" | "")g");
  EXPECT_EQ(Feed(h, "aaabcb"), -1);
  EXPECT_EQ(Feed(h, std::string(8, 'a') + std::string(8, 'c')), -1);  // 256 parses open
  const int refused = Feed(h, std::string(30, 'a'));
  EXPECT_GE(refused, 8);
  EXPECT_LE(refused, 13);
  // After a token no parse allows (the sampler found nothing allowed), only the end remains.
  static const auto table = Table();
  GrammarConstraint c(table, h);
  for (int i = 0; i < 30; ++i) c.Accept('a');
  EXPECT_FALSE(c.Allows('b'));
  EXPECT_TRUE(c.Allows(static_cast<int32_t>(table->kind.size()) - 1));
}

TEST(Grammar, PathologicalGrammarsAreBounded) {
  // 2^30 ways to the same parse: each state is expanded once, so it is quick.
  std::string doubling;
  for (int i = 0; i < 30; ++i) {
    absl::StrAppend(&doubling, "a", i, " ::= a", i + 1, " | a", i + 1, "\n");
  }
  doubling += "a30 ::= \"y\"\n";
  EXPECT_EQ(Feed(Compiled("root ::= a0\n" + doubling), "y"), -1);
  // 2^13 different parses open at the start: refused; opened by a character: it is refused.
  std::string branching;
  for (int i = 0; i < 13; ++i) {
    absl::StrAppend(&branching, "b", i, " ::= b", i + 1, " \"1\" | b", i + 1, " \"2\"\n");
  }
  branching += "b13 ::= \"y\"\n";
  EXPECT_TRUE(absl::StrContains(ErrorOf("root ::= b0\n" + branching), "too ambiguous or too deep"));
  auto late = Compiled("root ::= \"x\" b0 | \"z\"\n" + branching);
  EXPECT_EQ(Feed(late, "x"), 0);
  EXPECT_EQ(Feed(late, "z"), -1);
  // A chain of 1,500 rules before the first character; parentheses 300 deep.
  std::string chain = "root ::= r0\n";
  for (int i = 0; i < 1500; ++i) {
    absl::StrAppend(&chain, "r", i, " ::= r", i + 1, "\n");
  }
  chain += "r1500 ::= \"c\"\n";
  EXPECT_TRUE(absl::StrContains(ErrorOf(chain), "nests more than 1000 rules"));
  EXPECT_TRUE(absl::StrContains(
      ErrorOf("root ::= " + std::string(300, '(') + "\"a\"" + std::string(300, ')')),
      "parentheses nest more than 256 deep"));
  EXPECT_EQ(
      Feed(Compiled("root ::= " + std::string(200, '(') + "\"a\"" + std::string(200, ')')), "a"),
      -1);
}

TEST(Grammar, AMaskPastItsBudgetEndsTheOutputWithAnError) {
  // Three optional runs of letters: after many letters, hundreds of parses are open.
  static const auto table = Table();
  auto g = Compiled("root ::= [a-z]{0,60} [a-z]{0,60} [a-z]{0,60}");
  GrammarConstraint roomy(table, g), tight(table, g, /*scan_budget=*/100);
  std::vector<uint8_t> a, b;
  for (int i = 0; i < 40; ++i) {
    roomy.Accept('a');
    tight.Accept('a');
  }
  roomy.AllowedTokens(static_cast<int>(table->kind.size()), &a);
  EXPECT_TRUE(roomy.status().ok());
  EXPECT_TRUE(a['z']);
  tight.AllowedTokens(static_cast<int>(table->kind.size()), &b);
  EXPECT_EQ(tight.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(tight.status().message(), "simplify the grammar"));
}

TEST(Grammar, AcceptsWhatLlamaCppAccepts) {
  // Repetitions of what can be empty (the loop ends at a state already expanded).
  auto g = Compiled(R"g(root ::= ("a"?)* "b")g");
  EXPECT_EQ(Feed(g, "aab"), -1);
  EXPECT_EQ(Feed(g, "b"), -1);
  EXPECT_EQ(Feed(g, "ac"), 1);
  auto h = Compiled("root ::= ([a-z]*)+ \".\"");
  EXPECT_EQ(Feed(h, "abc."), -1);
  auto w = Compiled("root ::= \"x\" ws* \"y\"\nws ::= [ \\t]*");
  EXPECT_EQ(Feed(w, "x \t y"), -1);
  // A repetition after a repetition applies to the whole of it: "a"{2}? is ("a" "a")?.
  auto r = Compiled(R"g(root ::= "a"{2}? "b" [0-9]+* "c")g");
  EXPECT_EQ(Feed(r, "aab12c"), -1);
  EXPECT_EQ(Feed(r, "bc"), -1);
  EXPECT_EQ(Feed(r, "ab"), 1);
  // An enumeration of 300 words (as JSON-schema converters write), a lone \r ending a rule,
  // and a maximum past any count (no maximum).
  std::string words = "root ::= \"a\" (";
  for (int i = 0; i < 300; ++i) absl::StrAppend(&words, i ? " | " : "", "\"w", 1000 + i, "\"");
  auto e = Compiled(words + ")");
  EXPECT_EQ(Feed(e, "aw1299"), -1);
  EXPECT_EQ(Feed(e, "aw1300"), 3);  // no word begins w13
  auto cr = Compiled("root ::= x\rx ::= \"q\"{0,99999999999}");
  EXPECT_EQ(Feed(cr, std::string(3000, 'q')), -1);
}

TEST(Grammar, JsonGrammar) {
  auto g = Compiled(R"g(root ::= value
value ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ( "," ws member )* )? "}"
member ::= string ws ":" ws value ws
array ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
string ::= "\"" ( [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws ::= [ \t\n]*)g");
  EXPECT_EQ(Feed(g, R"({"a": [1, -2.5e3, true, null, {"b": "x\"\u00e9"}], "c": {}})"), -1);
  EXPECT_EQ(Feed(g, R"({"a": 01})"), 7);
  EXPECT_EQ(Feed(g, R"({"a" 1})"), 5);
  EXPECT_EQ(Feed(g, R"([1, 2,])"), 6);
}

TEST(Grammar, ErrorsNameWhatAndWhere) {
  struct Case {
    const char* grammar;
    const char* says;
  };
  const Case cases[] = {
      {"root = \"a\"", "line 1, column 6: expecting ::="},
      {"root ::= \"a\"\nx ::= \"b\" y", "rule 'y' is used but not defined"},
      {"root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule 'root' is defined twice"},
      {"item ::= \"a\"", "no rule 'root'"},
      {"root ::= root \"a\" | \"b\"", "rule 'root' is left-recursive"},
      {"root ::= x? root \"a\" | \"b\"\nx ::= \"x\"", "rule 'root' is left-recursive"},
      {"root ::= \"a\"{2001}", "at most 2000 repetitions"},
      {"root ::= \"a\"{3,2}", "maximum is below its minimum"},
      {"root ::= \"\\q\"", "line 1, column 11: unknown escape"},
      {"root ::= \"abc", "no closing quote"},
      {"root ::= (\"a\" | \"b\"", "no closing )"},
      {"root ::= [a-", "no closing ]"},
      {"root ::= [z-a]", "runs backwards"},
      {"root ::= <[1000]>", "token references"},
      {"root ::= * \"a\"", "a repetition must follow an item"},
      {"root ::= \"a\" )", "expecting a newline or the end"},
      {"root ::= \"\\x4\"", "expecting 2 hex digits"},
  };
  for (const Case& c : cases) {
    const std::string e = ErrorOf(c.grammar);
    EXPECT_TRUE(absl::StrContains(e, c.says)) << c.grammar << "\ngave: " << e;
  }
  EXPECT_TRUE(absl::StrContains(ErrorOf(std::string(Grammar::kMaxText + 1, ' ')), "at most"));
  EXPECT_TRUE(absl::StrContains(ErrorOf("root ::= \"" + std::string(200, 'x') + "\"{2000}"),
                                "more than 200000 elements"));
  // {m,n} with n past the cap has no maximum, as in llama.cpp.
  auto g = Compiled("root ::= \"a\"{1,5000}");
  EXPECT_EQ(Feed(g, std::string(6000, 'a')), -1);
}

}  // namespace
}  // namespace tinyserve
