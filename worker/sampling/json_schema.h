// File: worker/sampling/json_schema.h
// JSON Schema for constrained decoding (OpenAI's response_format json_schema): a schema is
// compiled once into nodes, and a SchemaRecognizer checks output bytes against it.
//
// Supported, as OpenAI's strict mode: "type" object (with "properties": every property is
// written, in the schema's order; "required" and "additionalProperties" are read as strict),
// array ("items", "minItems", "maxItems"), string ("minLength", "maxLength": characters, i.e.
// code points, an escape sequence counting as one and an escaped surrogate pair as one), number,
// integer
// ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum": a digit is refused once no integer
// it could start lies within them; a number's bounds likewise, as exact decimals, with no
// exponent written: number_range.h), boolean, null; "enum" and "const" of scalars; a schema without
// "type" accepts any JSON value. Also what Pydantic and zod emit for nested and optional fields:
//   - "$ref" to a local JSON pointer ("#/$defs/Address", "#/definitions/X", "#"), recursion
//     included (each target is compiled once);
//   - "anyOf" / "oneOf", and a list of types ("type": ["string", "null"]), when the
//     alternatives start with different bytes (an object, an array, a string, a number, true or
//     false, null...), so the first byte of a value picks its alternative and decoding stays
//     deterministic; or when they are all objects whose first property is the same key holding
//     a different string "const" (or one-value "enum") in each, a tagged union, picked once
//     that value is written; other alternatives that can start alike are refused;
//   - "allOf" of one schema (Pydantic wraps a $ref so).
// A string's "pattern" (worker/sampling/regex.h: ECMA-262/Python syntax without lookaround or
// backreferences; the string contains a match, "^" and "$" anchor it) is compiled into an
// automaton with minLength/maxLength folded in, and checked on the decoded string as it is
// written (escapes and surrogate pairs included); "pattern" needs "type": "string".
// Refused with an error naming the schema path: "not", "if", "patternProperties",
// "prefixItems", a "required" name that is not a property, a "multipleOf" that is not > 0
// (others are accepted, not enforced), remote "$ref"s and any "type" not listed. Nesting: at most 16 levels; at most
// kMaxPatterns patterns whose automata hold kMaxPatternTable transitions in all (one pattern's
// caps are regex.h's), so a schema's compile stays bounded as one pattern's is.
//
// Thread safety: a compiled JsonSchema is immutable (shared); a SchemaRecognizer is per request.
#pragma once

#include <array>
#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/sampling/json_constraint.h"
#include "worker/sampling/number_range.h"
#include "worker/sampling/regex.h"

namespace tinyserve {

struct SchemaNode {
  enum class Kind : uint8_t {
    kAny,
    kObject,
    kArray,
    kString,
    kNumber,
    kInteger,
    kLiterals,
    kAnyOf
  };
  Kind kind = Kind::kAny;
  std::vector<std::string> keys;  // kObject: each key as a JSON string ("\"name\"")
  std::vector<int> children;      // kObject: the node of each key; kArray: {items};
                                  // kAnyOf: the alternatives
  std::array<uint64_t, 4> first{};  // the bytes a value of this node can start with
  int min_items = 0;                // kArray: items; kString: characters (minLength, maxLength)
  int max_items = INT_MAX;
  bool bounded = false;  // kInteger: minimum/maximum, inclusive (INT64_MIN, INT64_MAX: none)
  int64_t min_value = 0, max_value = 0;
  std::shared_ptr<const NumberRange> range;  // kNumber: its bounds, exactly; null: none
  std::vector<std::string> literals;  // kLiterals: the JSON texts allowed (enum, const, bool, null)
  int pattern = -1;  // kString: its "pattern" (JsonSchema::pattern), lengths folded in; -1: none
  // kAnyOf of objects told apart by their first property, a string const under the same key
  // in each (a tagged union: {"type": "cat", ...} | {"type": "dog", ...}): the alternative is
  // picked once that value is read.
  bool discriminated = false;
};

class JsonSchema {
 public:
  static constexpr size_t kMaxPatterns = 64;
  static constexpr size_t kMaxPatternTable = size_t{1} << 23;  // 32 MB of transitions
  // INVALID_ARGUMENT naming the schema path ("json_schema.properties.age.type: ...").
  static absl::StatusOr<std::shared_ptr<const JsonSchema>> Compile(std::string_view schema);
  const std::vector<SchemaNode>& nodes() const { return nodes_; }  // nodes_[0] is the root
  const Regex& pattern(int i) const { return *patterns_[i]; }

 private:
  std::vector<SchemaNode> nodes_;
  std::vector<std::shared_ptr<const Regex>> patterns_;
  friend class SchemaCompiler;
};

// Byte-level recognizer of one JSON value matching a compiled schema. Copyable (fixed arrays);
// whitespace between tokens is bounded as in JsonRecognizer.
class SchemaRecognizer {
 public:
  explicit SchemaRecognizer(const JsonSchema* schema) : schema_(schema) {}

  // False when the bytes cannot continue a matching value (the state is then unspecified).
  bool Feed(std::string_view bytes);
  // The value is whole: only whitespace may follow.
  bool Complete() const;

  static constexpr int kMaxDepth = 16;

 private:
  struct Frame {
    int16_t node = 0;
    uint8_t phase = 0;
    uint8_t sub = 0;     // string: hex digits left in \uXXXX; number: its state
    uint32_t index = 0;  // object: key; array: items so far; number/literal: bytes read
    uint64_t mask = 0;   // literals: the candidates still possible; see json_schema.cc
  };

  bool Byte(unsigned char c);
  bool StartValue(int node, unsigned char c);  // c is not whitespace
  bool EndValue();  // pops the finished value; the parent expects what follows it
  bool Whitespace();
  const SchemaNode& NodeOf(const Frame& f) const { return schema_->nodes()[f.node]; }

  const JsonSchema* schema_;
  std::array<Frame, kMaxDepth> stack_{};
  int depth_ = 0;
  bool done_ = false;
  uint8_t whitespace_ = 0;
  JsonRecognizer any_{/*object_only=*/false};  // the innermost schema-less value
  JsonStringMatcher pattern_;                  // the innermost string with a pattern
  std::array<char, kMaxJsonNumber> number_{};  // the innermost bounded number's text
  uint8_t number_len_ = 0;
  std::string_view Number() const { return {number_.data(), number_len_}; }
};

}  // namespace tinyserve
