#include "worker/sampling/sampling_params.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace tinyserve {

absl::Status ValidateSamplingParams(const SamplingParams& p, int vocab_size, int max_context) {
  auto bad = [](const std::string& msg) { return absl::InvalidArgumentError(msg); };
  if (!std::isfinite(p.temperature) || p.temperature < 0 || p.temperature > 100)
    return bad(absl::StrCat("temperature must be in [0, 100], got ", p.temperature));
  if (p.top_k < 0) return bad(absl::StrCat("top_k must be >= 0, got ", p.top_k));
  if (!std::isfinite(p.top_p) || p.top_p <= 0 || p.top_p > 1)
    return bad(absl::StrCat("top_p must be in (0, 1], got ", p.top_p));
  if (!std::isfinite(p.min_p) || p.min_p < 0 || p.min_p > 1)
    return bad(absl::StrCat("min_p must be in [0, 1], got ", p.min_p));
  if (!std::isfinite(p.repetition_penalty) || p.repetition_penalty <= 0 ||
      p.repetition_penalty > 10)
    return bad(absl::StrCat("repetition_penalty must be in (0, 10], got ", p.repetition_penalty));
  if (!std::isfinite(p.presence_penalty) || std::fabs(p.presence_penalty) > 2)
    return bad(absl::StrCat("presence_penalty must be in [-2, 2], got ", p.presence_penalty));
  if (!std::isfinite(p.frequency_penalty) || std::fabs(p.frequency_penalty) > 2)
    return bad(absl::StrCat("frequency_penalty must be in [-2, 2], got ", p.frequency_penalty));
  if (p.max_tokens <= 0) return bad(absl::StrCat("max_tokens must be > 0, got ", p.max_tokens));
  if (max_context > 0 && p.max_tokens > max_context)
    return bad(absl::StrCat("max_tokens ", p.max_tokens, " exceeds the context length ",
                            max_context));
  if (p.min_tokens < 0 || p.min_tokens > p.max_tokens)
    return bad(absl::StrCat("min_tokens must be in [0, max_tokens = ", p.max_tokens, "], got ",
                            p.min_tokens));
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || id >= vocab_size)
      return bad(absl::StrCat("logit_bias: id ", id, " is out of range [0, ", vocab_size, ")"));
    if (!std::isfinite(bias) || bias < -100 || bias > 100)
      return bad(
          absl::StrCat("logit_bias: the bias of ", id, " must be in [-100, 100], got ", bias));
  }
  if (!p.response_format.empty() && p.response_format != "text" &&
      p.response_format != "json_object" && p.response_format != "json_schema" &&
      p.response_format != "regex" && p.response_format != "grammar")
    return bad(absl::StrCat(
        "response_format must be text, json_object, json_schema, regex or grammar, got '",
        p.response_format, "'"));
  if ((p.response_format == "json_schema") != !p.json_schema.empty())
    return bad("json_schema: needed exactly when response_format is json_schema");
  if ((p.response_format == "regex") != !p.regex.empty())
    return bad("regex: needed exactly when response_format is regex");
  if ((p.response_format == "grammar") != !p.grammar.empty())
    return bad("grammar: needed exactly when response_format is grammar");
  if (p.thinking_token_budget.has_value() && *p.thinking_token_budget < 0)
    return bad(absl::StrCat("thinking_token_budget must be >= 0, got ", *p.thinking_token_budget));
  if (!p.reasoning_format.empty() && p.reasoning_format != "qwen3" &&
      p.reasoning_format != "deepseek_r1")
    return bad(absl::StrCat("reasoning_format must be qwen3 or deepseek_r1, got '",
                            p.reasoning_format, "'"));
  if (p.thinking_token_budget.has_value() && p.reasoning_format.empty())
    return bad("thinking_token_budget needs a reasoning_format (qwen3 or deepseek_r1)");
  if (p.logprobs < -1 || p.logprobs > 20)
    return bad(absl::StrCat("logprobs must be in [-1, 20], got ", p.logprobs));
  if (p.prompt_logprobs < -1 || p.prompt_logprobs > 20)
    return bad(absl::StrCat("prompt_logprobs must be in [-1, 20], got ", p.prompt_logprobs));
  if (p.stop.size() > 16) return bad(absl::StrCat("stop: at most 16 strings, got ", p.stop.size()));
  for (const auto& s : p.stop) {
    if (s.empty()) return bad("stop: empty stop string");
    if (s.size() > 256) return bad("stop: a stop string is longer than 256 bytes");
  }
  for (int32_t id : p.stop_token_ids)
    if (id < 0 || id >= vocab_size)
      return bad(absl::StrCat("stop_token_ids: id ", id, " is out of range [0, ", vocab_size, ")"));
  return absl::OkStatus();
}

}  // namespace tinyserve
