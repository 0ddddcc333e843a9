// File: worker/tokenizer/chat_template.cc
// RenderChat (declared in tokenizer.h): ChatML, as SmolLM2-Instruct's template renders it
// (model-formats.md §1.3):
//   [<|im_start|>system\n{default system}<|im_end|>\n]   when the template carries a default
//                                                       system turn and messages[0] is not
//                                                       a system message
//   <|im_start|>{role}\n{content}<|im_end|>\n            per message
//   <|im_start|>assistant\n                             when add_generation_prompt
// Any other template is rendered as plain ChatML (no default system turn).
#include "worker/tokenizer/tokenizer.h"

namespace tinyserve {
namespace {

constexpr std::string_view kSmolLmSystem =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

void AppendTurn(std::string_view role, std::string_view content, std::string* out) {
  out->append("<|im_start|>").append(role).append("\n");
  out->append(content).append("<|im_end|>\n");
}

}  // namespace

std::string RenderChat(const TokenizerData& data, const std::vector<ChatMessage>& messages,
                       bool add_generation_prompt) {
  std::string out;
  const bool default_system = data.chat_template.find(kSmolLmSystem) != std::string::npos;
  if (default_system && !messages.empty() && messages[0].role != "system") {
    AppendTurn("system", kSmolLmSystem, &out);
  }
  for (const ChatMessage& m : messages) AppendTurn(m.role, m.content, &out);
  if (add_generation_prompt) out.append("<|im_start|>assistant\n");
  return out;
}

}  // namespace tinyserve
