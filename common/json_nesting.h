// File: common/json_nesting.h
// What parsing JSON text will cost, measured before parsing: parsers, dumpers and renderers
// recurse (nesting), and nlohmann::ordered_json finds an object's key by scanning the keys
// before it, so an object of n members costs n² (100,000 members: 10 s). Untrusted text is
// bounded on both first.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <vector>

namespace tinyserve {

struct JsonCost {
  int nesting = 0;            // the deepest nesting of arrays and objects
  uint64_t ordered_work = 0;  // the sum over objects of (members)²
};

// An object of 10,000 members (about 0.1 s of ordered_json parsing), or many smaller ones.
inline constexpr uint64_t kMaxJsonOrderedWork = 100'000'000;

// Measured outside strings (text that is not JSON gets numbers too; the parser then refuses it).
// Members are counted in the outermost 4,096 levels; text nested deeper is refused for its
// nesting by every caller.
inline JsonCost MeasureJson(std::string_view text) {
  constexpr uint32_t kArray = UINT32_MAX;
  constexpr size_t kTracked = 4096;
  JsonCost cost;
  std::vector<uint32_t> members;  // per open container: an object's members so far, or kArray
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      cost.nesting = std::max(cost.nesting, ++depth);
      if (members.size() < kTracked && static_cast<size_t>(depth) == members.size() + 1) {
        members.push_back(c == '{' ? 0 : kArray);
      }
    } else if (c == ':') {
      if (!members.empty() && static_cast<size_t>(depth) == members.size() &&
          members.back() != kArray) {
        ++members.back();
      }
    } else if (c == '}' || c == ']') {
      if (!members.empty() && static_cast<size_t>(depth) == members.size()) {
        if (members.back() != kArray) {
          cost.ordered_work += uint64_t{members.back()} * members.back();
        }
        members.pop_back();
      }
      --depth;
    }
  }
  // Objects left open (text cut short) were parsed before the parser found the end missing.
  for (uint32_t m : members) {
    if (m != kArray) cost.ordered_work += uint64_t{m} * m;
  }
  return cost;
}

// The deepest nesting of arrays and objects in JSON text.
inline int JsonNesting(std::string_view text) { return MeasureJson(text).nesting; }

// Text a server may parse into ordered_json: nested at most max_nesting deep, and within
// kMaxJsonOrderedWork.
inline bool JsonAffordable(std::string_view text, int max_nesting) {
  const JsonCost cost = MeasureJson(text);
  return cost.nesting <= max_nesting && cost.ordered_work <= kMaxJsonOrderedWork;
}

}  // namespace tinyserve
