// File: worker/tokenizer/chat_template.cc
// RenderChat (declared in tokenizer.h): the model's own chat template, rendered by
// worker/tokenizer/jinja.cc as transformers' apply_chat_template renders it (variables
// messages, add_generation_prompt, bos_token, eos_token). A model without a template, or with
// one outside the Jinja subset, gets plain ChatML:
//   <|im_start|>{role}\n{content}<|im_end|>\n   per message
//   <|im_start|>assistant\n                    when add_generation_prompt
#include <atomic>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "nlohmann/json.hpp"
#include "worker/tokenizer/jinja.h"
#include "worker/tokenizer/tokenizer.h"

namespace tinyserve {
namespace {

std::string TokenText(const TokenizerData& data, int32_t id) {
  return id >= 0 && id < static_cast<int32_t>(data.tokens.size()) ? data.tokens[id] : "";
}

std::string PlainChatMl(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out;
  for (const ChatMessage& m : messages) {
    out.append("<|im_start|>").append(m.role).append("\n").append(m.content).append("<|im_end|>\n");
  }
  if (add_generation_prompt) out.append("<|im_start|>assistant\n");
  return out;
}

}  // namespace

absl::Status CheckChatTemplate(const TokenizerData& data) {
  if (data.chat_template.empty()) return absl::OkStatus();
  return jinja::Template::Parse(data.chat_template).status();
}

absl::StatusOr<std::string> RenderChat(const TokenizerData& data,
                                       const std::vector<ChatMessage>& messages,
                                       bool add_generation_prompt) {
  if (data.chat_template.empty()) return PlainChatMl(messages, add_generation_prompt);
  absl::StatusOr<jinja::Template> t = jinja::Template::Parse(data.chat_template);
  if (!t.ok()) {
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true)) {
      TS_LOG(WARNING) << t.status().message() << "; chat prompts are rendered as plain ChatML";
    }
    return PlainChatMl(messages, add_generation_prompt);
  }
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
  const nlohmann::ordered_json variables = {{"messages", std::move(list)},
                                            {"add_generation_prompt", add_generation_prompt},
                                            {"bos_token", TokenText(data, data.bos_id)},
                                            {"eos_token", TokenText(data, data.eos_id)}};
  absl::StatusOr<std::string> out = t->Render(variables);
  if (!out.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model's chat template refused the messages: ", out.status().message()));
  }
  return out;
}

}  // namespace tinyserve
