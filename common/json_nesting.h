// File: common/json_nesting.h
// Nesting depth of JSON text, measured before parsing: parsers, dumpers and renderers recurse,
// so untrusted text is bounded first.
#pragma once

#include <algorithm>
#include <string_view>

namespace tinyserve {

// The deepest nesting of arrays and objects in JSON text, outside strings (text that is not JSON
// gets a number too; the parser then refuses it).
inline int JsonNesting(std::string_view text) {
  int depth = 0, deepest = 0;
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
      deepest = std::max(deepest, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace tinyserve
