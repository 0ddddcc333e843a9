// File: worker/tokenizer/jinja.h
// The part of Jinja2 that Hugging Face chat templates use, rendered as transformers renders
// them (apply_chat_template: trim_blocks, lstrip_blocks, loop controls, raise_exception,
// strftime_now, namespace, and a tojson that is json.dumps with ensure_ascii=False), so a
// model's own template builds its prompt, checked against transformers by goldens
// (scripts/make_chat_goldens.py).
//
// Supported: text, {{ }}, {% %} and {# #} with -/+ whitespace control; if/elif/else, for (tuple
// targets, an inline if filter, else, loop.index/index0/first/last/length/revindex/revindex0/
// previtem/nextitem, break, continue), set (names, namespace attributes, set blocks),
// generation blocks; literals, lists, dicts, tuples, attribute and item access, slices, calls,
// filters, tests, the arithmetic, comparison, membership, concatenation, boolean and
// conditional operators; Python's str() of values and jinja2's Undefined (printed as nothing,
// an error when its attribute or item is taken). A template outside this (macros, call and
// filter blocks, an unknown filter, test, method or function) is refused by Parse, naming the
// construct. Bounds, for templates from corrupt or hostile model files: expressions 100 deep,
// statements 200, a million steps, 16 MB per value and of output, 256 MB built in all, checked
// integer arithmetic; each is an INVALID_ARGUMENT, never a crash.
#ifndef TINYSERVE_WORKER_TOKENIZER_JINJA_H_
#define TINYSERVE_WORKER_TOKENIZER_JINJA_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tinyserve::jinja {

struct Program;  // the parsed template (jinja.cc)

class Template {
 public:
  // INVALID_ARGUMENT naming the construct and its offset for a template outside the subset.
  static absl::StatusOr<Template> Parse(std::string_view source);

  // Renders with these variables (a JSON object: messages, add_generation_prompt, bos_token,
  // ...). INVALID_ARGUMENT with the template's own message for raise_exception, or naming the
  // operation that failed (a type error, an undefined value where one is required).
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& variables) const;

 private:
  std::shared_ptr<const Program> program_;
};

}  // namespace tinyserve::jinja

#endif  // TINYSERVE_WORKER_TOKENIZER_JINJA_H_
