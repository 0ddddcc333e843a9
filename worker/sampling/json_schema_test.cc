#include "worker/sampling/json_schema.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "absl/strings/str_cat.h"
#include "worker/sampling/sampler.h"

namespace tinyserve {
namespace {

std::shared_ptr<const JsonSchema> MustCompile(const std::string& schema) {
  auto s = JsonSchema::Compile(schema);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : nullptr;
}

// Whether `text` is accepted (every byte) and whether the value is then complete.
std::pair<bool, bool> Check(const JsonSchema& schema, std::string_view text) {
  SchemaRecognizer r(&schema);
  const bool ok = r.Feed(text);
  return {ok, ok && r.Complete()};
}

// Greedy sampling under the schema with fixed logits over `tokens` (token 0 ends the text),
// for at most `steps` tokens; the text produced.
std::string GreedyText(const JsonSchema& schema, const std::vector<const char*>& tokens,
                       std::vector<float> logits, int steps) {
  auto table = std::make_shared<TokenTable>();
  for (size_t i = 0; i < tokens.size(); ++i) {
    table->bytes.push_back(tokens[i]);
    table->kind.push_back(i == 0 ? TokenTable::kEnd : TokenTable::kNormal);
  }
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  s.SetConstraint(
      std::make_unique<RecognizerConstraint<SchemaRecognizer>>(table, SchemaRecognizer(&schema)));
  std::string text;
  std::vector<int32_t> out;
  for (int step = 0; step < steps; ++step) {
    std::vector<float> l = logits;  // Sample may mask them
    const int32_t id = s.Sample(l.data(), static_cast<int>(l.size()), out).id;
    out.push_back(id);
    if (id == 0) break;
    text += table->bytes[id];
  }
  return text;
}

const char kPerson[] = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string"},
    "age": {"type": "integer"},
    "height": {"type": "number"},
    "languages": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
    "role": {"enum": ["admin", "user", 3, null]},
    "active": {"type": "boolean"},
    "extra": {},
    "nothing": {"type": "null"}
  },
  "required": ["name", "age"],
  "additionalProperties": false
})";

TEST(JsonSchema, AcceptsMatchingValuesAndEveryPrefix) {
  auto schema = MustCompile(kPerson);
  const std::string docs[] = {
      R"({"name": "Ada", "age": 36, "height": 1.7e0, "languages": ["en", "fr"], "role": "admin",
          "active": true, "extra": {"any": [1, "x", null]}, "nothing": null})",
      R"({"name":"B\"o\u00e9","age":-0,"height":-12,"languages":["x"],"role":3,"active":false,"extra":-1.5,"nothing":null})",
      "{\n  \"name\": \"C\",\n  \"age\": 7,\n  \"height\": 0.5,\n  \"languages\": [\"a\", \"b\", "
      "\"c\"],\n  \"role\": null,\n  \"active\": true,\n  \"extra\": \"s\",\n  \"nothing\": "
      "null\n}",
  };
  for (const std::string& d : docs) {
    EXPECT_EQ(Check(*schema, d), std::make_pair(true, true)) << d;
    // The output ends with the value: no whitespace after it (a small model pads otherwise).
    EXPECT_FALSE(Check(*schema, d + "\n").first) << d;
    for (size_t n = 0; n < d.size(); ++n) {
      const auto [ok, complete] = Check(*schema, d.substr(0, n));
      EXPECT_TRUE(ok) << d.substr(0, n);
      // Incomplete before the closing brace; trailing whitespace may follow a whole value.
      if (n <= d.find_last_of('}')) {
        EXPECT_FALSE(complete) << d.substr(0, n);
      }
    }
  }
}

TEST(JsonSchema, RejectsWhatBreaksTheSchema) {
  auto schema = MustCompile(kPerson);
  const std::string head = R"({"name": "A", "age": )";
  const std::string bad[] = {
      R"({"age": 3)",                               // properties come in the schema's order
      R"({"name": 5)",                              // a string expected
      head + "1.5",                                 // an integer expected
      head + "\"7\"",                               // a number, not a string
      head + R"(1, "height": 2, "languages": [])",  // minItems 1
      head + R"(1, "height": 2, "languages": ["a","b","c","d"])",       // maxItems 3
      head + R"(1, "height": 2, "languages": ["a"], "role": "guest")",  // not in the enum
      head + R"(1, "height": 2, "languages": ["a"], "role": 4)",
      head + R"(1, "height": 2, "languages": ["a"], "role": "admin", "active": 1)",
      head + R"(1, "height": 2, "languages": ["a"], "role": "admin", "active": true, "extra": 1,
               "nothing": null, "more": 1)",  // no additional properties
      head + R"(1})",                         // a property missing (strict)
  };
  for (const std::string& b : bad) EXPECT_FALSE(Check(*schema, b).first) << b;
}

TEST(JsonSchema, ScalarsAndAnyAtTheRoot) {
  auto number = MustCompile(R"({"type": "number"})");
  EXPECT_EQ(Check(*number, "12"), std::make_pair(true, true));  // may end here
  EXPECT_EQ(Check(*number, "12."), std::make_pair(true, false));
  EXPECT_FALSE(Check(*number, "12 3").first);
  auto color = MustCompile(R"({"enum": ["red", "reddish"]})");
  EXPECT_EQ(Check(*color, R"("red")"), std::make_pair(true, true));
  EXPECT_EQ(Check(*color, R"("redd)"), std::make_pair(true, false));
  EXPECT_FALSE(Check(*color, R"("blue")").first);
  auto any = MustCompile("{}");
  EXPECT_EQ(Check(*any, "[1, {\"a\": null}]"), std::make_pair(true, true));
  EXPECT_EQ(Check(*any, "-3"), std::make_pair(true, true));
  auto konst = MustCompile(R"({"const": "yes"})");
  EXPECT_EQ(Check(*konst, R"("yes")"), std::make_pair(true, true));
  EXPECT_FALSE(Check(*konst, R"("no")").first);
  auto empty = MustCompile(R"({"type": "object"})");
  EXPECT_EQ(Check(*empty, "{ }"), std::make_pair(true, true));
  EXPECT_FALSE(Check(*empty, R"({"a": 1})").first);
}

TEST(JsonSchema, RefusesWhatItCannotEnforceNamingThePath) {
  const std::pair<const char*, const char*> cases[] = {
      // Alternatives that can start alike: the first byte could not pick one.
      {R"({"anyOf": [{"type": "object"}, {"type": "object", "properties": {}}]})",
       "json_schema.anyOf: alternative 1 can start with '{'"},
      {R"({"oneOf": [{"type": "integer"}, {"type": "number"}]})", "json_schema.oneOf"},
      {R"({"anyOf": [{"enum": ["a", 1]}, {"type": "string"}]})", "json_schema.anyOf"},
      {R"({"anyOf": []})", "json_schema.anyOf"},
      {R"({"type": ["string", "decimal"]})", "json_schema.type[1].type"},
      {R"({"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}})",
       "json_schema.properties.a.$ref: '#/$defs/x' does not resolve"},
      {R"({"$ref": "https://example.com/s.json"})", "json_schema.$ref"},
      {R"({"$ref": "#"})", "json_schema.$ref"},
      {R"({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}},
           "$ref": "#/$defs/a"})",
       "json_schema.$ref.anyOf"},
      {R"({"allOf": [{"type": "string"}, {"type": "null"}]})", "json_schema.allOf"},
      {R"({"not": {"type": "string"}})", "json_schema.not"},
      {R"({"type": "decimal"})", "json_schema.type"},
      {R"({"type": "string", "pattern": "(?=a)b"})",
       "json_schema.pattern: at offset 2: lookaround"},
      {R"({"type": "string", "pattern": 3})", "json_schema.pattern: must be a string"},
      {R"({"type": "string", "pattern": "^\\d{3}$", "maxLength": 2})",
       "json_schema.pattern: matches no text within the length bounds"},
      {R"({"pattern": "a"})", "json_schema.pattern: is supported beside"},
      {R"({"enum": ["a", "b"], "type": "string", "pattern": "a"})", "json_schema.pattern"},
      {R"({"patternProperties": {}})", "json_schema.patternProperties"},
      {R"({"type": "number", "multipleOf": 0})", "json_schema.multipleOf: must be a number > 0"},
      {R"({"type": "object", "properties": {}, "required": ["a"], "additionalProperties": false})",
       "json_schema.required: names \"a\", which is not in \"properties\""},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", "json_schema"},
      {R"({"enum": []})", "json_schema.enum"},
      {R"([1])", "json_schema"},
      {"{nope", "json_schema"},
  };
  for (const auto& [schema, path] : cases) {
    auto s = JsonSchema::Compile(schema);
    ASSERT_FALSE(s.ok()) << schema;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(s.status().message()).rfind(path, 0), 0u) << s.status();
  }
  std::string nested = "{}";
  for (int i = 0; i < 20; ++i) nested = R"({"type": "array", "items": )" + nested + "}";
  EXPECT_FALSE(JsonSchema::Compile(nested).ok());
  // A long chain of references is bounded like nesting (no deep recursion on hostile input).
  auto chain_of = [](int n) {
    std::string defs = R"({"$ref": "#/$defs/a0", "$defs": {)";
    for (int i = 0; i < n; ++i) {
      absl::StrAppend(&defs, "\"a", i, "\": {\"$ref\": \"#/$defs/a", i + 1, "\"},");
    }
    absl::StrAppend(&defs, "\"a", n, "\": {\"type\": \"null\"}}}");
    return defs;
  };
  auto chain = JsonSchema::Compile(chain_of(5000));
  ASSERT_FALSE(chain.ok());
  EXPECT_NE(std::string(chain.status().message()).find("deeper than 16"), std::string::npos)
      << chain.status();
  // An object of 100,000 members would take ordered_json's parser some 10 s (it scans the keys
  // before each one): refused before parsing.
  auto wide = JsonSchema::Compile(chain_of(100000));
  ASSERT_FALSE(wide.ok());
  EXPECT_NE(std::string(wide.status().message()).find("too many members"), std::string::npos)
      << wide.status();
}

// Patterns are bounded in number and, together, in automaton size (each compile is bounded by
// regex.h's caps; a schema of many must not add up past them unchecked).
TEST(JsonSchema, PatternsAreBoundedTogether) {
  auto properties = [](int n, const std::function<std::string(int)>& pattern) {
    std::string s = R"({"type": "object", "properties": {)";
    for (int i = 0; i < n; ++i) {
      absl::StrAppend(&s, i > 0 ? ", " : "", "\"p", i, "\": {\"type\": \"string\", ",
                      "\"pattern\": \"", pattern(i), "\"}");
    }
    return s + "}}";
  };
  const auto small = [](int) { return std::string("^a+$"); };
  EXPECT_TRUE(JsonSchema::Compile(properties(JsonSchema::kMaxPatterns, small)).ok());
  auto many = JsonSchema::Compile(properties(JsonSchema::kMaxPatterns + 1, small));
  ASSERT_FALSE(many.ok());
  EXPECT_EQ(std::string(many.status().message())
                .rfind("json_schema.properties.p64.pattern: more than 64", 0),
            0u)
      << many.status();
  // 1,024 random 30-letter words each: about 1.6M transitions a pattern.
  std::mt19937 rng(5);
  const auto words = [&](int) {
    std::string alternatives;
    for (int w = 0; w < 1024; ++w) {
      if (w > 0) alternatives += '|';
      for (int k = 0; k < 30; ++k)
        alternatives +=
            static_cast<char>("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"[rng() % 52]);
    }
    return "^(" + alternatives + ")$";
  };
  auto large = JsonSchema::Compile(properties(8, words));
  ASSERT_FALSE(large.ok());
  EXPECT_NE(std::string(large.status().message()).find("patterns together would pass"),
            std::string::npos)
      << large.status();
}

// What Pydantic emits for nested models, Optional fields and recursive types.
const char kPydantic[] = R"({
  "$defs": {
    "Address": {"type": "object", "required": ["city", "zip"],
                "properties": {"city": {"type": "string"},
                               "zip": {"anyOf": [{"type": "string"}, {"type": "null"}]}}},
    "Node": {"type": "object",
             "properties": {"v": {"type": "integer"},
                            "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}
  },
  "type": "object",
  "properties": {
    "name": {"type": "string"},
    "nick": {"type": ["string", "null"]},
    "home": {"$ref": "#/$defs/Address"},
    "tags": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
    "tree": {"allOf": [{"$ref": "#/$defs/Node"}]},
    "n": {"oneOf": [{"type": "integer"}, {"enum": ["many", false]}]}
  }
})";

TEST(JsonSchema, RefsAndAlternativesPickedByTheFirstByte) {
  auto schema = MustCompile(kPydantic);
  ASSERT_NE(schema, nullptr);
  const std::string good[] = {
      R"({"name": "A", "nick": null, "home": {"city": "X", "zip": "123"}, "tags": ["a"],
          "tree": {"v": 1, "kids": [{"v": 2, "kids": []}, {"v": 3, "kids": [{"v": 4, "kids": []}]}]},
          "n": 3})",
      R"({"name":"B","nick":"Bo","home":{"city":"Y","zip":null},"tags":null,"tree":{"v":-1,"kids":[]},"n":"many"})",
      R"({"name":"C","nick":"","home":{"city":"","zip":""},"tags":[],"tree":{"v":0,"kids":[]},"n":false})",
  };
  for (const std::string& d : good) {
    EXPECT_EQ(Check(*schema, d), std::make_pair(true, true)) << d;
    for (size_t n = 0; n + 1 < d.size(); ++n) {
      EXPECT_TRUE(Check(*schema, d.substr(0, n)).first) << d.substr(0, n);
      EXPECT_FALSE(Check(*schema, d.substr(0, n)).second) << d.substr(0, n);
    }
  }
  const std::string bad[] = {
      R"({"name": "A", "nick": 5)",                                      // neither string nor null
      R"({"name": "A", "nick": null, "home": {"city": "X", "zip": 12)",  // zip: number
      R"({"name": "A", "nick": null, "home": {"city": "X", "zip": null}, "tags": "a")",
      R"({"name": "A", "nick": null, "home": {"city": "X", "zip": null}, "tags": null,
          "tree": {"v": 1, "kids": [1)",  // a kid is a Node
      R"({"name":"A","nick":null,"home":{"city":"X","zip":null},"tags":null,"tree":{"v":1,"kids":[]},"n":true)",
      R"({"name":"A","nick":null,"home":{"city":"X","zip":null},"tags":null,"tree":{"v":1,"kids":[]},"n":"few")",
  };
  for (const std::string& d : bad) EXPECT_FALSE(Check(*schema, d).first) << d;
  // A list of types at the root, with the other keywords applying to each.
  auto list = MustCompile(R"({"type": ["array", "null"], "items": {"type": "integer"},
                              "maxItems": 2})");
  EXPECT_EQ(Check(*list, "null"), std::make_pair(true, true));
  EXPECT_EQ(Check(*list, "[1, 2]"), std::make_pair(true, true));
  EXPECT_FALSE(Check(*list, "[1, 2, 3").first);
  EXPECT_FALSE(Check(*list, "[\"a\"").first);
}

// A $ref to an alias (itself a $ref) resolves to the aliased schema wherever it is used,
// and a schema too large for the recognizer's frames is refused.
TEST(JsonSchema, AliasesResolveToTheirTargetEverywhere) {
  auto schema = MustCompile(R"({
    "$defs": {"B": {"type": "string"}, "A": {"$ref": "#/$defs/B"},
              "C": {"allOf": [{"$ref": "#/$defs/A"}]}},
    "type": "object",
    "properties": {"x": {"$ref": "#/$defs/B"}, "y": {"$ref": "#/$defs/A"},
                   "z": {"type": "integer"}, "w": {"$ref": "#/$defs/A"},
                   "v": {"$ref": "#/$defs/C"}}})");
  ASSERT_NE(schema, nullptr);
  EXPECT_EQ(Check(*schema, R"({"x": "a", "y": "b", "z": 1, "w": "c", "v": "d"})"),
            std::make_pair(true, true));
  EXPECT_FALSE(Check(*schema, R"({"x": "a", "y": "b", "z": 1, "w": 7)").first);
  auto alias_only = MustCompile(R"({"$defs": {"B": {"type": "string"}, "A": {"$ref": "#/$defs/B"}},
                                    "type": "array", "items": {"$ref": "#/$defs/A"}})");
  EXPECT_EQ(Check(*alias_only, R"(["a", "b"])"), std::make_pair(true, true));
  // 100 objects of 400 properties: 40,000 parts.
  std::string wide = R"({"type": "object", "properties": {)";
  for (int o = 0; o < 100; ++o) {
    absl::StrAppend(&wide, o > 0 ? ", " : "", "\"o", o, R"(": {"type": "object", "properties": {)");
    for (int i = 0; i < 400; ++i) absl::StrAppend(&wide, i > 0 ? ", " : "", "\"p", i, "\": {}");
    wide += "}}";
  }
  wide += "}}";
  auto too_wide = JsonSchema::Compile(wide);
  ASSERT_FALSE(too_wide.ok());
  EXPECT_NE(std::string(too_wide.status().message()).find("32767"), std::string::npos);
}

TEST(JsonSchema, StringLengthsInCharacters) {
  auto schema = MustCompile(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  for (const char* ok : {"\"ab\"", "\"abc\"", "\"\u00e9\u00e9\u00e9\"", "\"\xc3\xa9\xc3\xa9\"",
                         "\"a\\n\"", "\"\\u00e9\\\"x\""}) {
    EXPECT_EQ(Check(*schema, ok), std::make_pair(true, true)) << ok;
  }
  EXPECT_FALSE(Check(*schema, "\"a\"").first);   // too short: the quote is refused
  EXPECT_FALSE(Check(*schema, "\"abcd").first);  // the fourth character is refused
  EXPECT_FALSE(Check(*schema, "\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9").first);
  EXPECT_TRUE(Check(*schema, "\"\xc3\xa9\xc3\xa9\xc3\xa9").first);  // 3 characters, 6 bytes
  auto bad = JsonSchema::Compile(R"({"type": "string", "minLength": 4, "maxLength": 3})");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(std::string(bad.status().message()).rfind("json_schema: minLength", 0), 0u);
  EXPECT_FALSE(JsonSchema::Compile(R"({"type": "string", "maxLength": -1})").ok());
  // An escaped surrogate pair is one character (a code point), as Python and JSON Schema count.
  const std::string pair = "\\ud83d\\uDE00";  // U+1F600
  for (const std::string& ok :
       std::vector<std::string>{"\"a" + pair + "\"", "\"" + pair + pair + pair + "\"",
                                "\"\\ud83dx\"", "\"" + pair + "\\ud83d\\ud83d\""}) {
    EXPECT_EQ(Check(*schema, ok), std::make_pair(true, true)) << ok;
  }
  EXPECT_FALSE(Check(*schema, "\"" + pair + "\"").first);  // one character: too short
  EXPECT_FALSE(Check(*schema, "\"" + pair + pair + pair + pair).first);
  // At maxLength, after a high surrogate, only its low half may follow.
  EXPECT_TRUE(Check(*schema, "\"ab\\ud83d\\udc").first);
  for (const char* bad :
       {"\"ab\\ud83d\\n", "\"ab\\ud83d\\u00", "\"ab\\ud83d\\ud8", "\"ab\\ud83dx", "\"abc\\udc00"}) {
    EXPECT_FALSE(Check(*schema, bad).first) << bad;
  }
  // A model that would go on writing "aaaa" is steered to close the string at 5 characters.
  auto five = MustCompile(R"({"type": "string", "maxLength": 5})");
  // Tokens <eos>, '"', "aaaa", "a"; the model prefers "aaaa", then "a", then the quote.
  EXPECT_EQ(GreedyText(*five, {"<eos>", "\"", "aaaa", "a"}, {0.0f, 1.0f, 5.0f, 2.0f}, 20),
            "\"aaaaa\"");
}

// A tagged union (Pydantic's discriminated union, a tool call): objects whose first property
// holds a different string const; the alternative is picked once the tag is read.
TEST(JsonSchema, TaggedUnionPickedByItsFirstProperty) {
  auto pet = MustCompile(R"({"oneOf": [
      {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}}},
      {"type": "object", "properties": {"kind": {"enum": ["dog"]}, "good": {"type": "boolean"}}},
      {"type": "object", "properties": {"kind": {"const": "catfish"}}}]})");
  for (const char* ok : {R"({"kind": "cat", "lives": 9})", R"({ "kind" : "dog","good":true})",
                         R"({"kind": "catfish"})"}) {
    EXPECT_EQ(Check(*pet, ok), std::make_pair(true, true)) << ok;
  }
  EXPECT_EQ(Check(*pet, R"({"kind": "ca)"), std::make_pair(true, false));  // cat or catfish
  for (const char* bad : {R"({"kind": "dog", "lives")", R"({"kind": "cow")", R"({"other")",
                          R"({"kind": "cat"})", R"({"kind": "catfish", )", R"([)"}) {
    EXPECT_FALSE(Check(*pet, bad).first) << bad;
  }
  // Inside an array and beside null (Optional[Union[...]]).
  auto list = MustCompile(R"({"type": "array", "items": {"anyOf": [{"$ref": "#/$defs/U"},
      {"type": "null"}]}, "$defs": {"U": {"anyOf": [
      {"type": "object", "properties": {"t": {"const": "a"}, "x": {"type": "string"}}},
      {"type": "object", "properties": {"t": {"const": "b"}}}]}}})");
  EXPECT_EQ(Check(*list, R"([{"t": "b"}, null, {"t": "a", "x": "y"}])"),
            std::make_pair(true, true));
  EXPECT_FALSE(Check(*list, R"([{"t": "a"}])").first);
  // At the nesting bound an object that must hold a value is not begun (it could not end).
  auto tree = MustCompile(R"({"$ref": "#/$defs/T", "$defs": {"T": {"anyOf": [
      {"type": "object", "properties": {"t": {"const": "leaf"}}},
      {"type": "object", "properties": {"t": {"const": "pair"}, "l": {"$ref": "#/$defs/T"}}}]}}})");
  std::string deep;
  for (int i = 0; i < 15; ++i) deep += R"({"t": "pair", "l": )";
  EXPECT_TRUE(Check(*tree, deep).first);
  EXPECT_FALSE(Check(*tree, deep + "{").first);
  // Not a tagged union: still refused, naming the list.
  for (const char* bad : {R"({"anyOf": [{"type": "object"}, {"type": "object"}]})",
                          R"({"anyOf": [{"type": "object", "properties": {"t": {"const": "a"}}},
                         {"type": "object", "properties": {"u": {"const": "b"}}}]})",
                          R"({"anyOf": [{"type": "object", "properties": {"t": {"const": "a"}}},
                         {"type": "object", "properties": {"t": {"const": "a"}}}]})",
                          R"({"anyOf": [{"type": "object", "properties": {"t": {"const": 1}}},
                         {"type": "object", "properties": {"t": {"const": 2}}}]})"}) {
    auto s = JsonSchema::Compile(bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(std::string(s.status().message()).find("json_schema.anyOf"), std::string::npos)
        << s.status();
  }
}

// Integer bounds: a digit is refused as soon as no integer it could start is within them.
TEST(JsonSchema, IntegerBoundsRefuseTheFirstDigitThatCannotFit) {
  auto age = MustCompile(R"({"type": "integer", "minimum": 18, "maximum": 120})");
  for (const char* ok : {"18", "120", "99", "100"}) {
    EXPECT_EQ(Check(*age, ok), std::make_pair(true, true)) << ok;
  }
  EXPECT_EQ(Check(*age, "1"), std::make_pair(true, false));   // 1 could become 18..19, 100..120
  EXPECT_EQ(Check(*age, "12"), std::make_pair(true, false));  // 120..129
  for (const char* bad : {"17", "121", "-", "0", "130", "1200"}) {
    EXPECT_FALSE(Check(*age, bad).first) << bad;
  }
  auto neg = MustCompile(R"({"type": "integer", "minimum": -10, "maximum": -3})");
  for (const char* ok : {"-3", "-10", "-7"}) {
    EXPECT_EQ(Check(*neg, ok), std::make_pair(true, true)) << ok;
  }
  for (const char* bad : {"-2", "-11", "-0", "5", "-100"}) {
    EXPECT_FALSE(Check(*neg, bad).first) << bad;
  }
  // Exclusive bounds, as numbers (draft 6+) and as booleans (draft 4); fractional bounds.
  auto pos = MustCompile(R"({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10})");
  EXPECT_FALSE(Check(*pos, "0").first);
  EXPECT_FALSE(Check(*pos, "10").first);
  EXPECT_EQ(Check(*pos, "9"), std::make_pair(true, true));
  auto d4 = MustCompile(R"({"type": "integer", "minimum": 0, "exclusiveMinimum": true,
                            "maximum": 2.5})");
  EXPECT_FALSE(Check(*d4, "0").first);
  EXPECT_EQ(Check(*d4, "2"), std::make_pair(true, true));
  EXPECT_FALSE(Check(*d4, "3").first);
  // Inside an object, the bound holds where the member ends.
  auto obj = MustCompile(R"({"type": "object", "properties": {"n": {"type": "integer",
                             "maximum": 5}, "s": {"type": "string"}}})");
  EXPECT_EQ(Check(*obj, R"({"n": 5, "s": "x"})"), std::make_pair(true, true));
  EXPECT_FALSE(Check(*obj, R"({"n": 6)").first);
  // Integer bounds are exact past 2^53.
  auto exact = MustCompile(R"({"type": "integer", "maximum": 9007199254740993})");
  EXPECT_EQ(Check(*exact, "9007199254740993"), std::make_pair(true, true));
  EXPECT_FALSE(Check(*exact, "9007199254740994").first);
  auto exact_min = MustCompile(R"({"type": "integer", "minimum": 9007199254740993})");
  EXPECT_EQ(Check(*exact_min, "9007199254740992"), std::make_pair(true, false));  // a prefix
  // Huge numbers saturate instead of overflowing; bounds near the int64 limits work.
  auto big = MustCompile(R"({"type": "integer", "minimum": -9000000000000000000})");
  EXPECT_EQ(Check(*big, "-8999999999999999999"), std::make_pair(true, true));
  EXPECT_FALSE(Check(*big, "-9000000000000000001").first);
  EXPECT_FALSE(Check(*big, "-99999999999999999999999").first);
  EXPECT_EQ(Check(*big, "99999999999999999999999"), std::make_pair(true, true));
  // Refusals name the path.
  auto empty = JsonSchema::Compile(R"({"type": "integer", "minimum": 3, "maximum": 2.5})");
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(std::string(empty.status().message()).rfind("json_schema: has no integer", 0), 0u);
  auto word = JsonSchema::Compile(R"({"type": "integer", "maximum": "ten"})");
  ASSERT_FALSE(word.ok());
  EXPECT_EQ(std::string(word.status().message()).rfind("json_schema.maximum", 0), 0u);
  // A model that would go on writing 9s is steered to end the number within the maximum.
  auto hundred = MustCompile(R"({"type": "integer", "maximum": 100})");
  EXPECT_EQ(GreedyText(*hundred, {"<eos>", "99", "9", "0"}, {0.0f, 5.0f, 4.0f, 3.0f}, 10), "99");
}

TEST(JsonSchema, PatternsHoldTheDecodedString) {
  auto zip = MustCompile(R"({"type": "object", "properties": {
      "zip": {"type": "string", "pattern": "^\\d{5}(-\\d{4})?$"},
      "tag": {"type": ["string", "null"], "pattern": "x", "maxLength": 3},
      "n": {"type": "integer", "pattern": "ignored for integers"}}})");
  ASSERT_NE(zip, nullptr);
  EXPECT_EQ(Check(*zip, R"({"zip": "12345", "tag": "axb", "n": 1})"), std::make_pair(true, true));
  EXPECT_EQ(Check(*zip, R"({"zip": "12345-6789", "tag": null, "n": 1})"),
            std::make_pair(true, true));
  EXPECT_EQ(Check(*zip, R"({"zip": "\u0031\u0032345", "tag": "x", "n": 1})"),
            std::make_pair(true, true));  // escapes are decoded before matching
  EXPECT_FALSE(Check(*zip, R"({"zip": "1234a)").first);
  EXPECT_FALSE(Check(*zip, R"({"zip": "1234")").first);                // too short to close
  EXPECT_FALSE(Check(*zip, R"({"zip": "123456)").first);               // a sixth digit
  EXPECT_FALSE(Check(*zip, R"({"zip": "12345", "tag": "abc)").first);  // 3 chars, no x
  EXPECT_FALSE(Check(*zip, R"({"zip": "12345", "tag": "ab")").first);  // no x
  EXPECT_TRUE(Check(*zip, R"({"zip": "12345", "tag": "ab)").first);    // x can still come
  // Greedy decoding with the pattern: the model's preferred prose is masked away.
  auto date = MustCompile(R"({"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}$"})");
  EXPECT_EQ(GreedyText(*date, {"<eos>", "\"", "today", "2026", "-", "12", "1", "\""},
                       {0, 1, 5, 2, 1, 1, 0.5f, 1}, 20),
            "\"2026-12\"");
}

TEST(JsonSchema, NumberBoundsAreExactDecimals) {
  // Pydantic's confidence: float = Field(ge=0, le=1), and a price with exclusive 0.1.
  auto s = MustCompile(R"({"type": "object", "properties": {
      "confidence": {"type": "number", "minimum": 0, "maximum": 1},
      "price": {"type": "number", "exclusiveMinimum": 0.1, "maximum": 99.99},
      "t": {"type": ["number", "null"], "minimum": -273.15}}})");
  ASSERT_NE(s, nullptr);
  auto check = [&](const std::string& c, const std::string& p, const std::string& t) {
    return Check(*s, R"({"confidence": )" + c + R"(, "price": )" + p + R"(, "t": )" + t + "}");
  };
  EXPECT_EQ(check("0.75", "0.11", "null"), std::make_pair(true, true));
  EXPECT_EQ(check("1", "99.99", "-273.15"), std::make_pair(true, true));
  EXPECT_EQ(check("0", "0.1000001", "-273.1"), std::make_pair(true, true));
  EXPECT_EQ(check("-0", "5", "1e3"), std::make_pair(false, false));  // no exponent when bounded
  EXPECT_FALSE(Check(*s, R"({"confidence": 1.5)").first);            // refused at the 5
  EXPECT_FALSE(Check(*s, R"({"confidence": 2)").first);              // at the 2
  EXPECT_TRUE(Check(*s, R"({"confidence": 1.)").first);              // 1.0 can follow
  EXPECT_FALSE(Check(*s, R"({"confidence": 1.0001)").first);
  EXPECT_TRUE(Check(*s, R"({"confidence": -0.)").first);  // -0.0 fits, -0.1 does not
  EXPECT_FALSE(Check(*s, R"({"confidence": -0.1)").first);
  EXPECT_FALSE(Check(*s, R"({"confidence": 0.5, "price": 0.1,)").first);  // exclusive 0.1
  EXPECT_TRUE(Check(*s, R"({"confidence": 0.5, "price": 0.1)").first);    // 0.10...1 may follow
  EXPECT_FALSE(Check(*s, R"({"confidence": 0.5, "price": 100)").first);
  EXPECT_FALSE(Check(*s, R"({"confidence": 0.5, "price": 5, "t": -274)").first);
  // Bounds that leave no number of at most 32 characters are refused, naming the path.
  auto none = JsonSchema::Compile(R"({"type": "number", "minimum": 2, "maximum": 1.5})");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("json_schema: has no number"), std::string::npos)
      << none.status();
  EXPECT_FALSE(JsonSchema::Compile(R"({"type": "number", "minimum": 1e40})").ok());
  EXPECT_FALSE(JsonSchema::Compile(R"({"type": "number", "exclusiveMinimum": 0,
                                       "maximum": 1e-35})")
                   .ok());
  EXPECT_TRUE(JsonSchema::Compile(R"({"type": "number", "minimum": 1e25})").ok());
  auto bad = JsonSchema::Compile(R"({"type": "number", "maximum": "ten"})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("json_schema.maximum"), std::string::npos);
  // Greedy decoding: the favourite "7" cannot start a number below 1, so "0." comes first.
  auto unit = MustCompile(R"({"type": "number", "minimum": 0, "exclusiveMaximum": 1})");
  EXPECT_EQ(GreedyText(*unit, {"<eos>", "7", "0", ".", "5"}, {0, 5, 1, 0.5f, 0.2f}, 6), "0.7777");
}

TEST(JsonSchema, ConstraintSteersASamplerToAMatchingValue) {
  auto schema = MustCompile(
      R"({"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}}})");
  auto table = std::make_shared<TokenTable>();
  for (const char* t : {"<eos>", "hello", "{", "}", "\"ok\"", ":", " true", "false", ",", "\"n\"",
                        "1", "2", ".5", " "}) {
    table->bytes.push_back(t);
    table->kind.push_back(std::string(t) == "<eos>" ? TokenTable::kEnd : TokenTable::kNormal);
  }
  for (float temperature : {0.0f, 1.0f}) {
    SamplingParams p;
    p.temperature = temperature;
    p.seed = 11;
    Sampler s(p);
    s.SetConstraint(std::make_unique<RecognizerConstraint<SchemaRecognizer>>(
        table, SchemaRecognizer(schema.get())));
    std::mt19937 noise(5);
    std::string text;
    std::vector<int32_t> out;
    for (int step = 0; step < 60; ++step) {
      std::vector<float> logits(table->bytes.size());
      std::uniform_real_distribution<float> u(0.0f, 1.0f);
      for (float& l : logits) l = u(noise);
      logits[1] = 9.0f;   // prose
      logits[12] = 8.0f;  // a fraction where an integer goes
      if (step > 8) logits[0] = 7.0f;
      const int32_t id = s.Sample(logits.data(), static_cast<int>(logits.size()), out).id;
      out.push_back(id);
      if (id == 0) break;
      text += table->bytes[id];
    }
    ASSERT_EQ(out.back(), 0) << text;
    EXPECT_EQ(Check(*schema, text), std::make_pair(true, true)) << text;
  }
}

}  // namespace
}  // namespace tinyserve
