// libFuzzer target for constrained decoding's recognizers (json_schema.h, json_constraint.h):
// the input's first line is a schema, the rest output bytes. Any schema compiles or gives
// INVALID_ARGUMENT; any bytes are accepted or refused, never a crash. Built with
// -DTINYSERVE_FUZZ=ON (clang).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "worker/sampling/json_schema.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nl = in.find('\n');
  const std::string_view schema_text = in.substr(0, nl);
  const std::string_view text = nl == std::string_view::npos ? "" : in.substr(nl + 1);
  tinyserve::JsonRecognizer any(/*object_only=*/false);
  if (any.Feed(text)) any.CanEnd();
  auto schema = tinyserve::JsonSchema::Compile(schema_text);
  if (!schema.ok()) {
    if (schema.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
    return 0;
  }
  tinyserve::SchemaRecognizer r(schema->get());
  for (char c : text) {
    tinyserve::SchemaRecognizer copy = r;  // as the constraint tests a token
    if (!copy.Feed(std::string_view(&c, 1))) break;
    r = copy;
    r.Complete();
  }
  return 0;
}
