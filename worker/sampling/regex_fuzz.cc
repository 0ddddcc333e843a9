// libFuzzer target for the regex automaton (regex.h): the input's first line is a pattern (its
// first byte also picks search mode and length bounds), the rest output bytes, fed as raw text
// and as the body of a JSON string. Any pattern compiles or gives INVALID_ARGUMENT; any bytes
// are accepted or refused, never a crash; and every state reached is live (a match can still
// follow), the automaton's promise of no dead ends. Built with -DTINYSERVE_FUZZ=ON (clang).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "worker/sampling/regex.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t nl = in.find('\n');
  const std::string_view pattern = in.substr(0, nl);
  const std::string_view text = nl == std::string_view::npos ? "" : in.substr(nl + 1);
  tinyserve::Regex::Options o;
  o.search = flags & 1;
  if (flags & 2) o.min_length = (flags >> 2) & 7;
  if (flags & 32) o.max_length = o.min_length + ((flags >> 6) & 3) * 4;
  auto re = tinyserve::Regex::Compile(pattern, o);
  if (!re.ok()) {
    if (re.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
    return 0;
  }
  const tinyserve::Regex& r = **re;
  auto live = [&r](int32_t s) { return r.Accepting(s) || r.AnyNext(s, 0, 0x10FFFF); };
  if (!live(r.start())) __builtin_trap();
  tinyserve::Utf8Matcher m;
  for (unsigned char c : text) {
    if (!m.Byte(r, c)) break;
    if (m.left == 0 && !live(m.state)) __builtin_trap();
  }
  tinyserve::JsonStringMatcher js(&r);
  for (unsigned char c : text) {
    if (js.Byte(c) != tinyserve::JsonStringMatcher::Step::kMore) break;
  }
  return 0;
}
