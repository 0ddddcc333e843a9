// libFuzzer target for GBNF grammars (grammar.h): the input up to its first NUL byte is a
// grammar, the rest output bytes fed one token per byte. Any grammar compiles or gives
// INVALID_ARGUMENT, quickly (the caps bound parsing, matching and recursion); any bytes are
// allowed or refused, never a crash; the vocabulary mask allows nothing Allows refuses (its scan
// budget may only refuse more), and end-of-generation only when the grammar is complete. Built
// with -DTINYSERVE_FUZZ=ON (clang).
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "worker/sampling/grammar.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::shared_ptr<const tinyserve::TokenTable> table = [] {
    auto t = std::make_shared<tinyserve::TokenTable>();
    for (int b = 0; b < 256; ++b) {
      t->bytes.push_back(std::string(1, static_cast<char>(b)));
      t->kind.push_back(tinyserve::TokenTable::kNormal);
    }
    t->bytes.push_back("");
    t->kind.push_back(tinyserve::TokenTable::kEnd);
    t->Index();
    return t;
  }();
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string_view text = in.substr(0, nul);
  const std::string_view output = nul == std::string_view::npos ? "" : in.substr(nul + 1);
  auto g = tinyserve::Grammar::Compile(text);
  if (!g.ok()) {
    if (g.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
    return 0;
  }
  tinyserve::GrammarConstraint c(table, *g);
  std::vector<uint8_t> mask;
  const int vocab = static_cast<int>(table->kind.size());
  for (unsigned char b : output) {
    c.AllowedTokens(vocab, &mask);
    if (mask[b] != 0 && !c.Allows(b)) __builtin_trap();  // the scan budget only refuses more
    if (mask[256] != 0) {
      if (!c.Complete()) __builtin_trap();
    }
    if (!mask[b]) break;
    c.Accept(b);
  }
  return 0;
}
