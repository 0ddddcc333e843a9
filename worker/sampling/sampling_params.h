// File: worker/sampling/sampling_params.h
// Per-request sampling and stopping parameters, with validation that names the bad field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace tinyserve {

struct SamplingParams {
  float temperature = 0.0f;        // 0 = greedy
  int top_k = 0;                   // 0 = off
  float top_p = 1.0f;              // 1 = off
  float min_p = 0.0f;              // 0 = off
  float repetition_penalty = 1.0f; // 1 = off (llama.cpp/CTRL style, over prompt + output)
  float presence_penalty = 0.0f;   // 0 = off (OpenAI style, over the output only)
  float frequency_penalty = 0.0f;  // 0 = off (OpenAI style, over the output only)
  uint64_t seed = 0;               // same seed, same output
  bool has_seed = false;           // false: seeded from the request id / a counter
  int max_tokens = 128;
  int min_tokens = 0;  // no end-of-generation, stop id or stop string before this
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, added to its logit)
  std::vector<std::string> stop;   // stop strings (not included in the output)
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool skip_special_tokens = true;  // control tokens add no text (vLLM's and llama.cpp's default)
  std::string response_format;     // "" or "text": free; "json_object": one JSON object;
                                   // "json_schema": a value matching json_schema;
                                   // "regex": a text matching regex;
                                   // "grammar": a text matching grammar
  std::string json_schema;         // the JSON Schema text (response_format json_schema)
  std::string regex;               // the whole output matches it (response_format regex)
  std::string grammar;             // GBNF the whole output matches (response_format grammar)
  int logprobs = -1;               // -1 = none; 0 = the chosen token's; n = also top n (<= 20)
  int prompt_logprobs = -1;        // the same for each prompt token (vLLM's prompt_logprobs)
  // A reasoning model (reasoning_constraint.h): reasoning_format "qwen3" (the output opens the
  // <think> block) or "deepseek_r1" (the prompt did); response_format then holds only the
  // answer after the block, which is closed after thinking_token_budget tokens (unset:
  // unbounded; needs a reasoning_format).
  std::optional<int> thinking_token_budget;
  std::string reasoning_format;
};

// InvalidArgument naming the field ("temperature must be in [0, 100], got -1").
// vocab_size bounds stop_token_ids; max_context bounds max_tokens (0 = unchecked).
absl::Status ValidateSamplingParams(const SamplingParams& p, int vocab_size, int max_context);

}  // namespace tinyserve
