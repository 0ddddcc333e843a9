#include "worker/sampling/json_constraint.h"

#include <gtest/gtest.h>

#include <random>

#include "worker/sampling/regex.h"
#include "worker/sampling/sampler.h"

namespace tinyserve {
namespace {

bool Accepts(std::string_view text) {
  JsonRecognizer r;
  return r.Feed(text);
}

bool Complete(std::string_view text) {
  JsonRecognizer r;
  return r.Feed(text) && r.Complete();
}

TEST(JsonRecognizer, AcceptsObjectsAndTheirPrefixes) {
  const std::string docs[] = {
      R"({})",
      R"({"a": 1})",
      R"( {"name": "Ada", "age": 36, "langs": ["en", "fr"], "ok": true, "x": null} )",
      R"({"n": [-0, 0.5, -12.25e+3, 1E-2, 7e9], "nested": {"deep": [[], {}, [{"k": false}]]}})",
      R"({"s": "quote \" backslash \\ slash \/ \b\f\n\r\t \u00e9 \uD83D\uDE00 ünï 字"})",
      "{\n  \"pretty\": [\n    1,\n    2\n  ]\n}\n",
  };
  for (const std::string& d : docs) {
    EXPECT_TRUE(Complete(d)) << d;
    // Every prefix is a valid partial document, and only the whole one is complete.
    for (size_t n = 0; n < d.size(); ++n) {
      EXPECT_TRUE(Accepts(d.substr(0, n))) << d.substr(0, n);
    }
  }
  EXPECT_FALSE(Complete(R"({"a": 1)"));
  EXPECT_FALSE(Complete(R"({"a": 12)"));
}

TEST(JsonRecognizer, RejectsWhatCannotContinue) {
  const char* bad[] = {
      "[1]",                // the top level must be an object
      "\"s\"",              // likewise
      "{a: 1}",             // keys are strings
      "{\"a\" 1}",          // colon missing
      "{\"a\": 1,}",        // trailing comma
      "{\"a\": 01}",        // leading zero
      "{\"a\": -}",         // sign without digits
      "{\"a\": 1.}",        // dot without digits
      "{\"a\": 1e}",        // exponent without digits
      "{\"a\": tru }",      // broken literal
      "{\"a\": [1 2]}",     // comma missing
      "{\"a\": [1}",        // mismatched close
      "{\"a\": \"x\ny\"}",  // raw control character in a string
      "{\"a\": \"\\x\"}",   // bad escape
      "{\"a\": \"\\u12G4\"}",
      "{} {}",  // one object only
      "{}x",
  };
  for (const char* b : bad) EXPECT_FALSE(Accepts(b)) << b;
}

TEST(JsonRecognizer, BoundsLoopsAModelCouldFallInto) {
  EXPECT_TRUE(Accepts("{" + std::string(24, ' ')));
  EXPECT_FALSE(Accepts("{" + std::string(25, ' ')));
  EXPECT_TRUE(Accepts("{\"a\": " + std::string(32, '1')));
  EXPECT_FALSE(Accepts("{\"a\": " + std::string(33, '1')));
  std::string deep = "{\"a\": ";
  for (int i = 0; i < 31; ++i) deep += "[";
  EXPECT_TRUE(Accepts(deep));
  EXPECT_FALSE(Accepts(deep + "["));
  // Long strings are fine (max_tokens bounds them).
  EXPECT_TRUE(Accepts("{\"a\": \"" + std::string(1000, 'x')));
}

std::shared_ptr<TokenTable> Table(const std::vector<std::string>& tokens) {
  auto t = std::make_shared<TokenTable>();
  for (const std::string& s : tokens) {
    t->bytes.push_back(s);
    t->kind.push_back(s == "<eos>"  ? TokenTable::kEnd
                      : s == "<sp>" ? TokenTable::kSpecial
                                    : TokenTable::kNormal);
  }
  return t;
}

TEST(JsonObjectConstraint, AllowsByGrammarEndOnlyWhenClosedSpecialNever) {
  auto table =
      Table({"<eos>", "<sp>", "{", "}", "\"k\"", ":", " 1", "hello", "{\"", "k\":", "\n", "}\n"});
  JsonObjectConstraint c(table, JsonRecognizer(/*object_only=*/true, /*trailing_space=*/false));
  EXPECT_FALSE(c.Allows(0));  // nothing yet
  EXPECT_FALSE(c.Allows(1));
  EXPECT_TRUE(c.Allows(2));
  EXPECT_TRUE(c.Allows(8));  // a token spanning grammar pieces
  EXPECT_FALSE(c.Allows(7));
  c.Accept(8);               // {"
  EXPECT_TRUE(c.Allows(9));  // k":
  EXPECT_TRUE(c.Allows(3));  // inside the key, } is text
  EXPECT_FALSE(c.Allows(0));
  c.Accept(9);
  EXPECT_FALSE(c.Allows(3));  // a value must come first
  EXPECT_TRUE(c.Allows(4));   // a string value
  EXPECT_FALSE(c.Allows(5));  // a second colon
  c.Accept(6);                // 1
  EXPECT_FALSE(c.Allows(0));
  EXPECT_TRUE(c.Allows(10));   // whitespace inside the object
  EXPECT_FALSE(c.Allows(11));  // but not after it: decoding ends with the value
  c.Accept(3);                 // }
  EXPECT_TRUE(c.Complete());
  EXPECT_TRUE(c.Allows(0));
  EXPECT_FALSE(c.Allows(2));
  EXPECT_FALSE(c.Allows(10));
  // Parsing (the default) takes trailing whitespace.
  EXPECT_TRUE(Complete("{\"k\": 1}\n "));
}

TEST(RecognizerConstraint, AllowedTokensWalkSaysWhatAllowsSays) {
  // Every string of 1 to 3 bytes over a small alphabet (a split é included), sorted by Index().
  const std::string alphabet = "{}\"a: 1,[]\xC3\xA9";
  std::vector<std::string> tokens = {"<eos>", "<sp>"};
  for (char a : alphabet) {
    tokens.push_back(std::string(1, a));
    for (char b : alphabet) {
      tokens.push_back(std::string{a, b});
      for (char c : alphabet) tokens.push_back(std::string{a, b, c});
    }
  }
  auto table = Table(tokens);
  table->Index();
  const int vocab = static_cast<int>(tokens.size());
  auto check = [&](const TokenConstraint& c, const std::string& where) {
    std::vector<uint8_t> walk;
    c.AllowedTokens(vocab, &walk);
    int allowed = 0;
    for (int id = 0; id < vocab; ++id) {
      ASSERT_EQ(walk[id] != 0, c.Allows(id)) << where << ": token " << id;
      allowed += walk[id];
    }
    EXPECT_GT(allowed, 0) << where;
  };
  const std::string doc = "{\"a\": [1, \"a\xC3\xA9\"], \"aa\": {}}";
  JsonObjectConstraint json(table, JsonRecognizer());
  auto re = Regex::Compile("a[0-9]{1,3}(:| )\xC3\xA9+");
  ASSERT_TRUE(re.ok());
  RecognizerConstraint<RegexRecognizer> regex(table, RegexRecognizer(re->get()));
  const std::string text = "a12:\xC3\xA9\xC3\xA9";
  auto id_of = [&](char c) {
    return static_cast<int32_t>(std::find(tokens.begin(), tokens.end(), std::string(1, c)) -
                                tokens.begin());
  };
  for (size_t i = 0; i <= doc.size(); ++i) {
    check(json, "json after " + std::to_string(i) + " bytes");
    if (i <= text.size()) check(regex, "regex after " + std::to_string(i) + " bytes");
    if (i < doc.size()) json.Accept(id_of(doc[i]));
    if (i < text.size()) regex.Accept(id_of(text[i]));
  }
  EXPECT_TRUE(json.Complete());
  EXPECT_TRUE(regex.Complete());
}

TEST(Sampler, JsonObjectConstraintShapesGreedyAndSampledOutput) {
  // A vocabulary whose unconstrained favourite is prose: the constraint must steer every
  // draw into a JSON object and end it, greedy or sampled.
  auto table =
      Table({"<eos>", "hello", " world", "{", "}", "\"a\"", ":", "1", ",", "\"b\"", "<sp>"});
  for (float temperature : {0.0f, 1.0f}) {
    SamplingParams p;
    p.temperature = temperature;
    p.seed = 3;
    Sampler s(p);
    s.SetConstraint(std::make_unique<JsonObjectConstraint>(table, JsonRecognizer()));
    JsonRecognizer check;
    std::mt19937 noise(7);
    std::vector<int32_t> out;
    for (int step = 0; step < 40; ++step) {
      std::vector<float> logits(table->bytes.size());
      std::uniform_real_distribution<float> u(0.0f, 1.0f);
      for (float& l : logits) l = u(noise);
      logits[1] = logits[2] = 8.0f;     // prose wins unconstrained
      logits[10] = 9.0f;                // and a special token even more
      if (step > 12) logits[0] = 6.0f;  // later, the end of text is likely too
      const int32_t id = s.Sample(logits.data(), static_cast<int>(logits.size()), out).id;
      out.push_back(id);
      if (id == 0) break;
      ASSERT_TRUE(check.Feed(table->bytes[id])) << "temperature " << temperature;
    }
    EXPECT_EQ(out.back(), 0) << "temperature " << temperature;
    EXPECT_TRUE(check.Complete()) << "temperature " << temperature;
  }
}

}  // namespace
}  // namespace tinyserve
