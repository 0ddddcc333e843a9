#include "worker/sampling/json_schema.h"

#include <charconv>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/json_nesting.h"
#include "nlohmann/json.hpp"

namespace tinyserve {

using ojson = nlohmann::ordered_json;  // properties keep the schema's order

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const ojson& root) : root_(root) {}
  absl::Status Compile(const ojson& s, const std::string& path, int depth, int* out);
  // Fills every node's first-byte set; refuses alternatives that can start alike.
  absl::Status Finish();
  std::vector<SchemaNode> nodes;
  std::vector<std::shared_ptr<const Regex>> patterns;

 private:
  absl::Status Ref(const ojson& ref, const std::string& path, int depth, int* out);
  absl::Status Alternatives(const std::vector<ojson>& alternatives, const std::string& path,
                            int depth, SchemaNode* node);
  absl::Status First(int index, std::vector<uint8_t>* state);
  bool Tagged(const SchemaNode& n) const;

  const ojson& root_;
  std::map<std::string, int> refs_;  // "$ref" -> its node (compiled once; recursion allowed)
  std::vector<std::string> paths_;   // per node, for Finish's errors
  size_t pattern_table_ = 0;         // transitions of the patterns compiled so far

  static absl::Status Bad(const std::string& path, absl::string_view message) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", message));
  }
  static std::string Dump(const ojson& v) {
    return v.dump(-1, ' ', false, ojson::error_handler_t::replace);
  }
  static absl::StatusOr<int> Count(const ojson& s, const char* key, const std::string& path,
                                   int fallback) {
    auto it = s.find(key);
    if (it == s.end()) return fallback;
    if (!it->is_number_unsigned() || it->get<uint64_t>() > INT_MAX) {
      return Bad(absl::StrCat(path, ".", key), "must be a non-negative integer");
    }
    return static_cast<int>(it->get<uint64_t>());
  }
  // An integer node's bounds: minimum/maximum, exclusiveMinimum/exclusiveMaximum as numbers
  // (draft 6+) or as booleans beside minimum/maximum (draft 4).
  // Draft 4's boolean form: "exclusiveMinimum": true makes "minimum" exclusive.
  static bool Draft4Exclusive(const ojson& s, const char* key) {
    auto it = s.find(key);
    return it != s.end() && it->is_boolean() && it->get<bool>();
  }
  static absl::Status IntegerBounds(const ojson& s, const std::string& path, SchemaNode* node) {
    // long double holds every int64 exactly, so integer bounds are exact.
    auto number = [&](const char* key, std::optional<long double>* out) -> absl::Status {
      auto it = s.find(key);
      if (it == s.end() || it->is_boolean()) return absl::OkStatus();
      if (!it->is_number()) return Bad(absl::StrCat(path, ".", key), "must be a number");
      if (it->is_number_unsigned()) {
        *out = static_cast<long double>(it->get<uint64_t>());
      } else if (it->is_number_integer()) {
        *out = static_cast<long double>(it->get<int64_t>());
      } else {
        *out = it->get<double>();
      }
      return absl::OkStatus();
    };
    auto flag = [&s](const char* key) { return Draft4Exclusive(s, key); };
    std::optional<long double> mn, mx, xmn, xmx;
    for (auto [key, out] :
         {std::pair{"minimum", &mn}, std::pair{"maximum", &mx}, std::pair{"exclusiveMinimum", &xmn},
          std::pair{"exclusiveMaximum", &xmx}}) {
      if (absl::Status st = number(key, out); !st.ok()) return st;
    }
    if (!mn && !mx && !xmn && !xmx) return absl::OkStatus();
    constexpr long double kMin = -9223372036854775808.0L, kMax = 9223372036854775808.0L;  // 2^63
    long double lo = kMin, hi = kMax;
    if (mn) lo = std::max(lo, flag("exclusiveMinimum") ? std::floor(*mn) + 1 : std::ceil(*mn));
    if (xmn) lo = std::max(lo, std::floor(*xmn) + 1);
    if (mx) hi = std::min(hi, flag("exclusiveMaximum") ? std::ceil(*mx) - 1 : std::floor(*mx));
    if (xmx) hi = std::min(hi, std::ceil(*xmx) - 1);  // (long double overloads)
    if (lo > hi) return Bad(path, "has no integer between its minimum and maximum");
    node->bounded = true;
    node->min_value = lo <= kMin ? INT64_MIN : static_cast<int64_t>(lo);
    node->max_value = hi >= kMax ? INT64_MAX : static_cast<int64_t>(hi);
    return absl::OkStatus();
  }
  // A number's bounds, exactly: each bound as the shortest decimal that reads back as the
  // schema's value (0.1 stays 0.1). Refused when no number of at most kMaxJsonNumber bytes
  // (without an exponent, which bounded numbers do not take) lies between them.
  static absl::Status NumberBounds(const ojson& s, const std::string& path, SchemaNode* node) {
    auto range = std::make_shared<NumberRange>();
    auto flag = [&s](const char* key) { return Draft4Exclusive(s, key); };
    for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      auto it = s.find(key);
      if (it == s.end() || it->is_boolean()) continue;  // draft 4's exclusive flags: below
      if (!it->is_number()) return Bad(absl::StrCat(path, ".", key), "must be a number");
      std::string text;
      if (it->is_number_unsigned()) {
        text = std::to_string(it->get<uint64_t>());
      } else if (it->is_number_integer()) {
        text = std::to_string(it->get<int64_t>());
      } else {
        char buf[64];
        const double v = it->get<double>();
        if (!std::isfinite(v)) return Bad(absl::StrCat(path, ".", key), "must be finite");
        text.assign(buf, std::to_chars(buf, buf + sizeof(buf), v).ptr);
      }
      const std::string_view k = key;
      const bool lower = k == "minimum" || k == "exclusiveMinimum";
      const bool exclusive = k == "exclusiveMinimum" || k == "exclusiveMaximum" ||
                             (k == "minimum" && flag("exclusiveMinimum")) ||
                             (k == "maximum" && flag("exclusiveMaximum"));
      if (!(lower ? range->SetLower(text, exclusive) : range->SetUpper(text, exclusive))) {
        return Bad(absl::StrCat(path, ".", key), "must be a number");
      }
    }
    if (!range->bounded()) return absl::OkStatus();
    bool any = false;
    for (char c : std::string_view("-0123456789")) {
      any = any || range->Reachable(std::string_view(&c, 1), kMaxJsonNumber - 1);
    }
    if (!any) {
      return Bad(path, absl::StrCat("has no number of at most ", kMaxJsonNumber,
                                    " characters between its minimum and maximum"));
    }
    node->range = std::move(range);
    return absl::OkStatus();
  }
  // node's min_items and max_items from the schema's min_key and max_key.
  static absl::Status Bounds(const ojson& s, const char* min_key, const char* max_key,
                             const std::string& path, SchemaNode* node) {
    auto lo = Count(s, min_key, path, 0);
    auto hi = Count(s, max_key, path, INT_MAX);
    if (!lo.ok()) return lo.status();
    if (!hi.ok()) return hi.status();
    if (*lo > *hi) return Bad(path, absl::StrCat(min_key, " is over ", max_key));
    node->min_items = *lo;
    node->max_items = *hi;
    return absl::OkStatus();
  }
};

absl::Status SchemaCompiler::Ref(const ojson& ref, const std::string& path, int depth, int* out) {
  if (!ref.is_string()) return Bad(path, "must be a string");
  const std::string name = ref.get<std::string>();
  if (name.empty() || name[0] != '#') {
    return Bad(path, "only references inside the schema (\"#/$defs/Name\") are supported");
  }
  if (auto it = refs_.find(name); it != refs_.end()) {
    if (it->second >= static_cast<int>(nodes.size())) return Bad(path, "refers to itself");
    *out = it->second;
    return absl::OkStatus();
  }
  const ojson* target = nullptr;
  try {
    const ojson::json_pointer pointer(name.substr(1));
    if (root_.contains(pointer)) target = &root_.at(pointer);
  } catch (const std::exception&) {  // a malformed pointer
  }
  if (target == nullptr) {
    return Bad(path, absl::StrCat("'", name, "' does not resolve inside the schema"));
  }
  // A target that makes a node is registered first, so references inside it (recursion) reach
  // that node. An alias (a $ref, or allOf of one) makes none: it is registered with what it
  // resolves to, afterwards; a chain of aliases is bounded by the depth.
  const bool alias = target->is_object() && (target->contains("$ref") || target->contains("allOf"));
  if (!alias) refs_[name] = static_cast<int>(nodes.size());  // the node Compile creates next
  if (absl::Status st = Compile(*target, path, depth + 1, out); !st.ok()) return st;
  refs_[name] = *out;
  return absl::OkStatus();
}

absl::Status SchemaCompiler::Alternatives(const std::vector<ojson>& alternatives,
                                          const std::string& path, int depth, SchemaNode* node) {
  if (alternatives.empty() || alternatives.size() > 64) {  // SchemaRecognizer's 64-bit masks
    return Bad(path, "must list 1 to 64 schemas");
  }
  node->kind = SchemaNode::Kind::kAnyOf;
  paths_.back() = path;  // Finish's errors name the list
  for (size_t i = 0; i < alternatives.size(); ++i) {
    int child = 0;
    if (auto st = Compile(alternatives[i], absl::StrCat(path, "[", i, "]"), depth + 1, &child);
        !st.ok()) {
      return st;
    }
    node->children.push_back(child);
  }
  return absl::OkStatus();
}

absl::Status SchemaCompiler::Compile(const ojson& s, const std::string& path, int depth, int* out) {
  if (depth > SchemaRecognizer::kMaxDepth) return Bad(path, "nests deeper than 16 levels");
  if (s.is_object()) {
    if (auto r = s.find("$ref"); r != s.end()) return Ref(*r, path + ".$ref", depth, out);
    if (auto a = s.find("allOf"); a != s.end()) {  // Pydantic: {"allOf": [{"$ref": ...}]}
      if (!a->is_array() || a->size() != 1) {
        return Bad(path + ".allOf", "only a list of one schema is supported");
      }
      return Compile((*a)[0], path + ".allOf[0]", depth + 1, out);
    }
  }
  if (nodes.size() >= INT16_MAX) {  // SchemaRecognizer's frames hold node indices in 16 bits
    return Bad(path, "the schema has more than 32767 parts");
  }
  const int index = static_cast<int>(nodes.size());
  *out = index;
  nodes.emplace_back();
  paths_.push_back(path);
  SchemaNode node;
  if (s.is_boolean() && s.get<bool>()) {  // `true`: anything
    nodes[index] = node;
    return absl::OkStatus();
  }
  if (!s.is_object()) return Bad(path, "must be a schema object");
  for (const char* k : {"not", "if", "patternProperties", "prefixItems"}) {
    if (s.contains(k)) return Bad(absl::StrCat(path, ".", k), "is not supported");
  }
  // Accepted, not enforced (docs/HTTP_API.md), but a schema that is no schema is refused.
  if (auto m = s.find("multipleOf");
      m != s.end() && !(m->is_number() && m->get<double>() > 0 && std::isfinite(m->get<double>()))) {
    return Bad(path + ".multipleOf", "must be a number > 0");
  }
  // "pattern" holds strings only (other types pass it by), so it needs the type said.
  if (s.contains("pattern") && (!s.contains("type") || s.contains("anyOf") || s.contains("oneOf") ||
                                s.contains("enum") || s.contains("const"))) {
    return Bad(path + ".pattern", "is supported beside \"type\": \"string\" only");
  }
  auto literal_ok = [](const ojson& v) { return !v.is_object() && !v.is_array(); };
  const ojson* any_of = nullptr;
  const char* any_of_key = nullptr;
  for (const char* k : {"anyOf", "oneOf"}) {
    if (auto a = s.find(k); a != s.end()) {
      if (any_of != nullptr) return Bad(path, "give anyOf or oneOf, not both");
      any_of = &*a;
      any_of_key = k;
    }
  }
  if (any_of != nullptr) {
    // oneOf is anyOf here: alternatives that start differently never both match.
    if (!any_of->is_array()) return Bad(absl::StrCat(path, ".", any_of_key), "must be a list");
    const std::vector<ojson> alternatives(any_of->begin(), any_of->end());
    if (auto st = Alternatives(alternatives, absl::StrCat(path, ".", any_of_key), depth, &node);
        !st.ok()) {
      return st;
    }
  } else if (auto t = s.find("type"); t != s.end() && t->is_array()) {
    // ["string", "null"]: one alternative per type, each with the schema's other keywords.
    std::vector<ojson> alternatives;
    for (const ojson& name : *t) {
      if (!name.is_string()) return Bad(path + ".type", "must list type names");
      ojson alternative = s;
      alternative["type"] = name;
      alternatives.push_back(std::move(alternative));
    }
    if (auto st = Alternatives(alternatives, path + ".type", depth, &node); !st.ok()) return st;
  } else if (auto c = s.find("const"); c != s.end()) {
    if (!literal_ok(*c)) return Bad(path + ".const", "must be a scalar");
    node.kind = SchemaNode::Kind::kLiterals;
    node.literals = {Dump(*c)};
  } else if (auto e = s.find("enum"); e != s.end()) {
    if (!e->is_array() || e->empty() || e->size() > 64) {
      return Bad(path + ".enum", "must list 1 to 64 values");
    }
    std::set<std::string> seen;
    node.kind = SchemaNode::Kind::kLiterals;
    for (const ojson& v : *e) {
      if (!literal_ok(v)) return Bad(path + ".enum", "values must be scalars");
      if (seen.insert(Dump(v)).second) node.literals.push_back(Dump(v));
    }
  } else if (auto t = s.find("type"); t != s.end()) {
    if (!t->is_string()) return Bad(path + ".type", "must be a type name or a list of them");
    const std::string type = t->get<std::string>();
    if (type == "object") {
      node.kind = SchemaNode::Kind::kObject;
      if (auto p = s.find("properties"); p != s.end()) {
        if (!p->is_object()) return Bad(path + ".properties", "must be an object");
        for (const auto& [key, sub] : p->items()) {
          int child = 0;
          if (auto st = Compile(sub, absl::StrCat(path, ".properties.", key), depth + 1, &child);
              !st.ok()) {
            return st;
          }
          node.keys.push_back(Dump(ojson(key)));
          node.children.push_back(child);
        }
      }
      // Every property is written; a required name that is not one could never be.
      if (auto r = s.find("required"); r != s.end()) {
        if (!r->is_array()) return Bad(path + ".required", "must be a list of property names");
        for (const ojson& name : *r) {
          auto p = s.find("properties");
          if (!name.is_string() || p == s.end() || !p->contains(name.get<std::string>())) {
            return Bad(path + ".required",
                       absl::StrCat("names ", Dump(name), ", which is not in \"properties\""));
          }
        }
      }
    } else if (type == "array") {
      node.kind = SchemaNode::Kind::kArray;
      int child = 0;
      auto items = s.find("items");
      if (auto st =
              Compile(items == s.end() ? ojson(true) : *items, path + ".items", depth + 1, &child);
          !st.ok()) {
        return st;
      }
      node.children = {child};
      if (auto st = Bounds(s, "minItems", "maxItems", path, &node); !st.ok()) return st;
    } else if (type == "string") {
      node.kind = SchemaNode::Kind::kString;
      if (auto st = Bounds(s, "minLength", "maxLength", path, &node); !st.ok()) return st;
      if (auto p = s.find("pattern"); p != s.end()) {
        if (!p->is_string()) return Bad(path + ".pattern", "must be a string");
        Regex::Options o;
        o.search = true;  // JSON Schema: the string contains a match
        o.min_length = node.min_items;
        o.max_length = node.max_items;
        if (patterns.size() >= JsonSchema::kMaxPatterns) {
          return Bad(path + ".pattern",
                     absl::StrCat("more than ", JsonSchema::kMaxPatterns, " patterns in a schema"));
        }
        auto re = Regex::Compile(p->get<std::string>(), o);
        if (!re.ok()) return Bad(path + ".pattern", re.status().message());
        pattern_table_ += (*re)->table_size();
        if (pattern_table_ > JsonSchema::kMaxPatternTable) {
          return Bad(path + ".pattern",
                     absl::StrCat("the schema's patterns together would pass ",
                                  JsonSchema::kMaxPatternTable, " automaton transitions"));
        }
        node.pattern = static_cast<int>(patterns.size());
        patterns.push_back(*std::move(re));
      }
    } else if (type == "number" || type == "integer") {
      node.kind = type == "number" ? SchemaNode::Kind::kNumber : SchemaNode::Kind::kInteger;
      if (auto st =
              type == "integer" ? IntegerBounds(s, path, &node) : NumberBounds(s, path, &node);
          !st.ok()) {
        return st;
      }
    } else if (type == "boolean") {
      node.kind = SchemaNode::Kind::kLiterals;
      node.literals = {"true", "false"};
    } else if (type == "null") {
      node.kind = SchemaNode::Kind::kLiterals;
      node.literals = {"null"};
    } else {
      return Bad(path + ".type", absl::StrCat("unknown type '", type, "'"));
    }
  }
  nodes[index] = std::move(node);
  return absl::OkStatus();
}

absl::Status SchemaCompiler::First(int index, std::vector<uint8_t>* state) {
  if ((*state)[index] == 2) return absl::OkStatus();
  if ((*state)[index] == 1) return Bad(paths_[index], "refers to itself without nesting");
  (*state)[index] = 1;
  std::array<uint64_t, 4> first{};
  auto add = [&first](std::string_view bytes) {
    for (unsigned char c : bytes) first[c >> 6] |= uint64_t{1} << (c & 63);
  };
  const SchemaNode& n = nodes[index];
  switch (n.kind) {
    case SchemaNode::Kind::kAny:
      add("{[\"-0123456789tfn");
      break;
    case SchemaNode::Kind::kObject:
      add("{");
      break;
    case SchemaNode::Kind::kArray:
      add("[");
      break;
    case SchemaNode::Kind::kString:
      add("\"");
      break;
    case SchemaNode::Kind::kNumber:
    case SchemaNode::Kind::kInteger:
      add("-0123456789");
      break;
    case SchemaNode::Kind::kLiterals:
      for (const std::string& lit : n.literals) add(lit.substr(0, 1));
      break;
    case SchemaNode::Kind::kAnyOf:
      if (Tagged(n)) {
        nodes[index].discriminated = true;
        add("{");
        break;
      }
      for (size_t i = 0; i < n.children.size(); ++i) {
        const int child = n.children[i];
        if (auto st = First(child, state); !st.ok()) return st;
        for (int w = 0; w < 4; ++w) {
          if (const uint64_t both = first[w] & nodes[child].first[w]; both != 0) {
            const char c = static_cast<char>(w * 64 + __builtin_ctzll(both));
            return Bad(paths_[index],
                       absl::StrCat("alternative ", i, " can start with '", std::string(1, c),
                                    "' as an earlier one does; only alternatives of different "
                                    "kinds (object, array, string, number, true/false, null) "
                                    "are supported"));
          }
          first[w] |= nodes[child].first[w];
        }
      }
      break;
  }
  nodes[index].first = first;
  (*state)[index] = 2;
  return absl::OkStatus();
}

// Whether the alternatives are objects tagged by their first property: the same key in each,
// holding a string const, a different one in each.
bool SchemaCompiler::Tagged(const SchemaNode& n) const {
  std::set<std::string> tags;
  for (int child : n.children) {
    const SchemaNode& alt = nodes[child];
    if (alt.kind != SchemaNode::Kind::kObject || alt.keys.empty() ||
        alt.keys[0] != nodes[n.children[0]].keys[0]) {
      return false;
    }
    const SchemaNode& tag = nodes[alt.children[0]];
    if (tag.kind != SchemaNode::Kind::kLiterals || tag.literals.size() != 1 ||
        tag.literals[0][0] != '"' || !tags.insert(tag.literals[0]).second) {
      return false;
    }
  }
  return true;
}

absl::Status SchemaCompiler::Finish() {
  std::vector<uint8_t> state(nodes.size(), 0);
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (auto st = First(static_cast<int>(i), &state); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const JsonSchema>> JsonSchema::Compile(std::string_view text) {
  // A schema nests at most 16 levels of schemas (a few JSON levels each); what it may hold
  // beside them ("default", "examples") is bounded too, and so is the parse's work.
  const JsonCost cost = MeasureJson(text);
  if (cost.nesting > 64)
    return absl::InvalidArgumentError("json_schema: nests deeper than 64 levels");
  if (cost.ordered_work > kMaxJsonOrderedWork) {
    return absl::InvalidArgumentError(
        "json_schema: objects of too many members (10,000 in one object at most)");
  }
  const ojson s = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (s.is_discarded()) return absl::InvalidArgumentError("json_schema: not valid JSON");
  SchemaCompiler c(s);
  int root = 0;
  if (auto st = c.Compile(s, "json_schema", 0, &root); !st.ok()) return st;
  if (auto st = c.Finish(); !st.ok()) return st;
  auto schema = std::shared_ptr<JsonSchema>(new JsonSchema());
  schema->nodes_ = std::move(c.nodes);
  schema->patterns_ = std::move(c.patterns);
  return std::shared_ptr<const JsonSchema>(std::move(schema));
}

namespace {

// Object and array phases.
enum Phase : uint8_t {
  kOpen = 0,     // after '{' or '['
  kKeyText = 1,  // inside a key (Frame::mask = bytes of it matched)
  kColon = 2,
  kValue = 3,  // object: after ':'; array: after ','
  kKey = 4,    // object: after ','
  kAfter = 5,  // after a member or element
  kTag = 6,    // a tagged union: inside its first property's value
};
// String phases.
enum StringPhase : uint8_t { kBody = 0, kEscape = 1, kUnicode = 2 };

bool IsHex(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
unsigned HexValue(unsigned char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }

// String frames count characters (Frame::index) as JSON Schema does, in code points: an escaped
// surrogate pair (\uD83D\uDE00) is one. Frame::mask holds the \u escape being read (bits 0-15),
// kHighPending after an escaped high surrogate, and kLowRequired while the escape being read
// fits maxLength only as that surrogate's second half.
constexpr uint64_t kHighPending = uint64_t{1} << 16;
constexpr uint64_t kLowRequired = uint64_t{1} << 17;

// Integer frames of a bounded node: Frame::phase is 1 for a minus sign, Frame::mask the
// magnitude so far (saturating far beyond any int64 bound).
uint64_t AppendDigit(uint64_t magnitude, unsigned char c) {
  constexpr uint64_t kCap = UINT64_MAX / 10 - 1;  // below it, magnitude * 10 + 9 fits
  return magnitude >= kCap ? UINT64_MAX : magnitude * 10 + (c - '0');
}

// A node's bounds for comparison; INT64_MIN and INT64_MAX stand for no bound (IntegerBounds).
constexpr __int128 kUnbounded = static_cast<__int128>(1) << 100;
__int128 Lo(int64_t lo) { return lo == INT64_MIN ? -kUnbounded : lo; }
__int128 Hi(int64_t hi) { return hi == INT64_MAX ? kUnbounded : hi; }

bool IntegerIn(bool negative, uint64_t magnitude, int64_t lo, int64_t hi) {
  const __int128 v = negative ? -static_cast<__int128>(magnitude) : magnitude;
  return v >= Lo(lo) && v <= Hi(hi);
}

// Whether an integer whose text starts with this prefix can still end within [lo, hi], with at
// most `more` further digits.
bool IntegerReachable(bool negative, uint64_t magnitude, NumState s, int more, int64_t min,
                      int64_t max) {
  const __int128 lo = Lo(min), hi = Hi(max);
  if (s == NumState::kMinus) return lo <= 0;  // "-0", or any negative integer
  if (s == NumState::kZero) return IntegerIn(negative, 0, min, max);
  __int128 a = magnitude, width = 1;  // with k more digits: magnitudes [a, a + width - 1]
  for (int k = 0; k <= more; ++k, a *= 10, width *= 10) {
    const __int128 b = a + width - 1;
    const __int128 vlo = negative ? -b : a, vhi = negative ? -a : b;
    if (vlo <= hi && vhi >= lo) return true;
    if (negative ? vhi < lo : vlo > hi) return false;  // more digits only move further away
  }
  return false;
}

}  // namespace

bool SchemaRecognizer::Feed(std::string_view bytes) {
  for (unsigned char c : bytes) {
    if (!Byte(c)) return false;
  }
  return true;
}

bool SchemaRecognizer::Whitespace() { return ++whitespace_ <= kMaxJsonWhitespace; }

bool SchemaRecognizer::Complete() const {
  if (done_) return true;
  if (depth_ != 1) return false;
  const Frame& f = stack_[0];
  const SchemaNode& n = NodeOf(f);
  switch (n.kind) {
    case SchemaNode::Kind::kAny:
      return any_.CanEnd();
    case SchemaNode::Kind::kNumber:
    case SchemaNode::Kind::kInteger:
      return NumberCanEnd(static_cast<NumState>(f.sub)) &&
             (!n.bounded || IntegerIn(f.phase == 1, f.mask, n.min_value, n.max_value)) &&
             (!n.range || n.range->Contains(Number()));
    case SchemaNode::Kind::kLiterals:
      for (size_t i = 0; i < n.literals.size(); ++i) {
        if ((f.mask >> i & 1) && n.literals[i].size() == f.index) return true;
      }
      return false;
    default:
      return false;
  }
}

bool SchemaRecognizer::EndValue() {
  if (--depth_ == 0) done_ = true;
  return true;
}

bool SchemaRecognizer::StartValue(int node, unsigned char c) {
  if (depth_ == kMaxDepth) return false;
  const SchemaNode& n = schema_->nodes()[node];
  // In the last frame a value cannot hold another: an object with properties (a tagged union
  // always has its tag) or an array that needs items would be a dead end, so it is not begun.
  if (depth_ == kMaxDepth - 1 && ((n.kind == SchemaNode::Kind::kObject && !n.keys.empty()) ||
                                  (n.kind == SchemaNode::Kind::kAnyOf && n.discriminated) ||
                                  (n.kind == SchemaNode::Kind::kArray && n.min_items > 0))) {
    return false;
  }
  if (n.kind == SchemaNode::Kind::kAnyOf && n.discriminated) {  // picked by the tag, later
    if (c != '{') return false;
    Frame f;
    f.node = static_cast<int16_t>(node);
    f.mask = n.children.size() >= 64 ? ~uint64_t{0}  // the alternatives still possible
                                     : (uint64_t{1} << n.children.size()) - 1;
    stack_[depth_++] = f;
    return true;
  }
  if (n.kind == SchemaNode::Kind::kAnyOf) {  // the first byte picks the alternative
    for (int child : n.children) {
      if (schema_->nodes()[child].first[c >> 6] >> (c & 63) & 1) return StartValue(child, c);
    }
    return false;
  }
  Frame f;
  f.node = static_cast<int16_t>(node);
  switch (n.kind) {
    case SchemaNode::Kind::kAnyOf:  // above
      return false;
    case SchemaNode::Kind::kAny:
      any_ = JsonRecognizer(/*object_only=*/false, /*trailing_space=*/false);
      if (!any_.Byte(c)) return false;
      break;
    case SchemaNode::Kind::kObject:
      if (c != '{') return false;
      break;
    case SchemaNode::Kind::kArray:
      if (c != '[') return false;
      break;
    case SchemaNode::Kind::kString:
      if (c != '"') return false;
      if (n.pattern >= 0) pattern_ = JsonStringMatcher(&schema_->pattern(n.pattern));
      break;
    case SchemaNode::Kind::kNumber:
    case SchemaNode::Kind::kInteger: {
      NumState s;
      if (!NumberStart(c, &s)) return false;
      f.sub = static_cast<uint8_t>(s);
      f.index = 1;
      if (n.range) {
        number_[0] = static_cast<char>(c);
        number_len_ = 1;
        if (!n.range->Reachable(Number(), kMaxJsonNumber - 1)) return false;
      }
      if (n.bounded) {
        f.phase = c == '-' ? 1 : 0;
        f.mask = c == '-' ? 0 : AppendDigit(0, c);
        if (!IntegerReachable(f.phase == 1, f.mask, s, kMaxJsonNumber - 1, n.min_value,
                              n.max_value))
          return false;
      }
      break;
    }
    case SchemaNode::Kind::kLiterals:
      for (size_t i = 0; i < n.literals.size(); ++i) {
        if (static_cast<unsigned char>(n.literals[i][0]) == c) f.mask |= uint64_t{1} << i;
      }
      if (f.mask == 0) return false;
      f.index = 1;
      break;
  }
  stack_[depth_++] = f;
  return true;
}

bool SchemaRecognizer::Byte(unsigned char c) {
  const bool ws = IsJsonWhitespace(c);
  if (!ws) whitespace_ = 0;
  if (done_) return false;  // the output ends with the value (no trailing whitespace)
  if (depth_ == 0) return ws ? Whitespace() : StartValue(0, c);
  Frame& f = stack_[depth_ - 1];
  const SchemaNode& n = NodeOf(f);
  switch (n.kind) {
    case SchemaNode::Kind::kAny: {
      JsonRecognizer next = any_;
      if (next.Byte(c)) {
        any_ = next;
        return true;
      }
      if (!any_.CanEnd()) return false;
      EndValue();
      return Byte(c);  // c belongs to what follows
    }
    case SchemaNode::Kind::kString:
      if (n.pattern >= 0) {  // the pattern's automaton holds the length bounds too
        switch (pattern_.Byte(c)) {
          case JsonStringMatcher::Step::kReject:
            return false;
          case JsonStringMatcher::Step::kMore:
            return true;
          case JsonStringMatcher::Step::kClosed:
            return EndValue();
        }
      }
      switch (f.phase) {
        case kBody:
          if (c == '"') return f.index >= static_cast<uint32_t>(n.min_items) && EndValue();
          if (c < 0x20) return false;
          if (c == '\\') {  // an escape is one character, unless it ends a surrogate pair
            if (f.index >= static_cast<uint32_t>(n.max_items)) {
              if (!(f.mask & kHighPending)) return false;
              f.mask |= kLowRequired;  // only the pair's second half fits
            }
            ++f.index;
            f.phase = kEscape;
            return true;
          }
          f.mask = 0;
          if ((c & 0xC0) != 0x80) {  // a character starts
            if (f.index >= static_cast<uint32_t>(n.max_items)) return false;
            ++f.index;
          }
          return true;
        case kEscape:
          if (c == 'u') {
            f.phase = kUnicode;
            f.sub = 4;
            f.mask &= kHighPending | kLowRequired;
            return true;
          }
          if (f.mask & kLowRequired) return false;
          f.mask = 0;
          f.phase = kBody;
          return c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' ||
                 c == 'r' || c == 't';
        default: {
          if (!IsHex(c)) return false;
          const uint64_t unit = (f.mask & 0xFFFF) << 4 | HexValue(c);
          // A required low surrogate is DC00..DFFF: its first two digits are D and C..F.
          if ((f.mask & kLowRequired) &&
              ((f.sub == 4 && unit != 0xD) || (f.sub == 3 && (unit < 0xDC || unit > 0xDF)))) {
            return false;
          }
          f.mask = (f.mask & ~uint64_t{0xFFFF}) | unit;
          if (--f.sub > 0) return true;
          f.phase = kBody;
          const bool high = unit >= 0xD800 && unit <= 0xDBFF;
          const bool low = unit >= 0xDC00 && unit <= 0xDFFF;
          if (low && (f.mask & kHighPending)) --f.index;  // one character with its first half
          f.mask = high ? kHighPending : 0;
          return true;
        }
      }
    case SchemaNode::Kind::kNumber:
    case SchemaNode::Kind::kInteger: {
      NumState s = static_cast<NumState>(f.sub);
      switch (NumberNext(c, n.kind == SchemaNode::Kind::kInteger, &s)) {
        case NumStep::kMore:
          if (f.index >= kMaxJsonNumber) return false;
          f.sub = static_cast<uint8_t>(s);
          if (n.bounded) {  // an integer: digits only
            f.mask = AppendDigit(f.mask, c);
            if (!IntegerReachable(f.phase == 1, f.mask, s, kMaxJsonNumber - 1 - f.index,
                                  n.min_value, n.max_value))
              return false;
          }
          if (n.range) {  // a bounded number: no exponent
            if (c == 'e' || c == 'E') return false;
            number_[number_len_++] = static_cast<char>(c);
            if (!n.range->Reachable(Number(), kMaxJsonNumber - number_len_)) return false;
          }
          ++f.index;
          return true;
        case NumStep::kEnded:
          if (n.bounded && !IntegerIn(f.phase == 1, f.mask, n.min_value, n.max_value)) return false;
          if (n.range && !n.range->Contains(Number())) return false;
          EndValue();
          return Byte(c);
        default:
          return false;
      }
    }
    case SchemaNode::Kind::kLiterals: {
      uint64_t next = 0;
      bool whole = false;  // a candidate ends exactly here
      for (size_t i = 0; i < n.literals.size(); ++i) {
        if (!(f.mask >> i & 1)) continue;
        const std::string& lit = n.literals[i];
        if (lit.size() == f.index) whole = true;
        if (lit.size() > f.index && static_cast<unsigned char>(lit[f.index]) == c) {
          next |= uint64_t{1} << i;
        }
      }
      if (next != 0) {
        f.mask = next;
        ++f.index;
        return true;
      }
      if (!whole) return false;
      EndValue();
      return Byte(c);
    }
    case SchemaNode::Kind::kAnyOf: {  // a tagged union, until its tag picks an alternative
      const std::string& key = schema_->nodes()[n.children[0]].keys[0];
      if (f.phase == kKeyText) {
        if (static_cast<unsigned char>(key[f.index]) != c) return false;
        if (++f.index == key.size()) f.phase = kColon;
        return true;
      }
      if (ws && f.phase != kTag) return Whitespace();
      switch (f.phase) {
        case kOpen:
          if (c != '"') return false;
          f.phase = kKeyText;
          f.index = 1;
          return true;
        case kColon:
          if (c != ':') return false;
          f.phase = kTag;
          f.index = 0;
          return true;
        default: {  // kTag: the bytes of one of the tags (JSON strings: none is another's prefix)
          uint64_t next = 0;
          int whole = -1;
          for (size_t i = 0; i < n.children.size(); ++i) {
            if (!(f.mask >> i & 1)) continue;
            const SchemaNode& alt = schema_->nodes()[n.children[i]];
            const std::string& tag = schema_->nodes()[alt.children[0]].literals[0];
            if (f.index < tag.size() && static_cast<unsigned char>(tag[f.index]) == c) {
              next |= uint64_t{1} << i;
              if (f.index + 1 == tag.size()) whole = static_cast<int>(i);
            }
          }
          if (next == 0) return f.index == 0 && ws && Whitespace();
          f.mask = next;
          ++f.index;
          if (whole >= 0) {  // the frame goes on as that object, after its first member
            f.node = static_cast<int16_t>(n.children[whole]);
            f.index = 0;
            f.mask = 0;
            f.phase = kAfter;
          }
          return true;
        }
      }
    }
    case SchemaNode::Kind::kObject:
      if (f.phase == kKeyText) {
        const std::string& key = n.keys[f.index];
        if (static_cast<unsigned char>(key[f.mask]) != c) return false;
        if (++f.mask == key.size()) f.phase = kColon;
        return true;
      }
      if (ws) return Whitespace();
      switch (f.phase) {
        case kOpen:
          if (n.keys.empty()) return c == '}' && EndValue();
          [[fallthrough]];
        case kKey:  // every property, in order (strict)
          if (c != '"') return false;
          f.phase = kKeyText;
          f.mask = 1;
          return true;
        case kColon:
          if (c != ':') return false;
          f.phase = kValue;
          return true;
        case kValue:
          f.phase = kAfter;
          return StartValue(n.children[f.index], c);
        default:  // kAfter
          if (f.index + 1 < n.keys.size()) {
            if (c != ',') return false;
            ++f.index;
            f.phase = kKey;
            return true;
          }
          return c == '}' && EndValue();
      }
    case SchemaNode::Kind::kArray:
      if (ws) return Whitespace();
      switch (f.phase) {
        case kOpen:
          if (c == ']' && n.min_items == 0) return EndValue();
          if (n.max_items == 0) return false;
          [[fallthrough]];
        case kValue:
          ++f.index;
          f.phase = kAfter;
          return StartValue(n.children[0], c);
        default:  // kAfter
          if (c == ',' && f.index < static_cast<uint32_t>(n.max_items)) {
            f.phase = kValue;
            return true;
          }
          return c == ']' && f.index >= static_cast<uint32_t>(n.min_items) && EndValue();
      }
  }
  return false;
}

}  // namespace tinyserve
