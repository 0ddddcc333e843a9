// libFuzzer target for the chat-template interpreter (jinja.h): the input is a template, from
// a model file that may be corrupt or hostile. It parses or gives INVALID_ARGUMENT; a parsed
// template renders a conversation with tools or gives INVALID_ARGUMENT; never a crash, a hang
// or unbounded memory. Built with -DTINYSERVE_FUZZ=ON (clang); seeds: jinja_fuzz_seeds.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "nlohmann/json.hpp"
#include "worker/tokenizer/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json kVariables = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                 {"role": "assistant", "content": " Hello \n"}, {"role": "user", "content": "é?"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
               "properties": {"x": {"type": "integer"}}}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})");
  auto t = tinyserve::jinja::Template::Parse(
      std::string_view(reinterpret_cast<const char*>(data), size));
  if (!t.ok()) {
    if (t.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
    return 0;
  }
  auto out = t->Render(kVariables);
  if (!out.ok() && out.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
  return 0;
}
