// File: worker/tokenizer/chat_template.cc
// RenderChat (declared in tokenizer.h): the model's own chat template, rendered by
// worker/tokenizer/jinja.cc as transformers' apply_chat_template renders it (variables
// messages, add_generation_prompt, bos_token, eos_token). A model without a template, or with
// one outside the Jinja subset, gets plain ChatML:
//   <|im_start|>{role}\n{content}<|im_end|>\n   per message
//   <|im_start|>assistant\n                    when add_generation_prompt
#include <atomic>
#include <cctype>

#include "absl/strings/str_cat.h"
#include "common/json_nesting.h"
#include "common/log.h"
#include "common/status.h"
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

absl::Status CheckTemplateKwargs(std::string_view text) {
  if (text.empty()) return absl::OkStatus();
  if (!JsonAffordable(text, 32))
    return absl::InvalidArgumentError(
        "nested deeper than 32 levels or objects of too many members");
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  for (const char* key : {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})
    if (j.contains(key))
      return absl::InvalidArgumentError(
          absl::StrCat("'", key, "' is set by the request itself, not by template kwargs"));
  return absl::OkStatus();
}

namespace {
absl::StatusOr<std::string> Render(const TokenizerData& data,
                                   const std::vector<ChatMessage>& messages,
                                   bool add_generation_prompt, std::string_view tools_json,
                                   std::string_view template_kwargs_json);

std::string_view Strip(std::string_view s) {  // Python's str.strip()
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}
}  // namespace

absl::StatusOr<std::string> RenderChat(const TokenizerData& data,
                                       const std::vector<ChatMessage>& messages,
                                       bool add_generation_prompt, std::string_view tools_json,
                                       bool continue_final_message,
                                       std::string_view template_kwargs_json) {
  TS_RETURN_IF_ERROR(CheckTemplateKwargs(template_kwargs_json));
  if (!continue_final_message)
    return Render(data, messages, add_generation_prompt, tools_json, template_kwargs_json);
  // transformers' way: mark the end of the final message's content, render, cut at the mark.
  constexpr std::string_view kTag = "CONTINUE_FINAL_MESSAGE_TAG ";
  if (messages.empty()) return absl::InvalidArgumentError("continue_final_message: no messages");
  if (add_generation_prompt) {
    return absl::InvalidArgumentError(
        "continue_final_message: cannot be combined with add_generation_prompt");
  }
  if (!data.chat_template.empty() && data.chat_template.find("content") == std::string::npos) {
    return absl::InvalidArgumentError(
        "continue_final_message: the chat template does not read a message's content");
  }
  std::vector<ChatMessage> marked = messages;
  marked.back().content += kTag;
  absl::StatusOr<std::string> out = Render(data, marked, false, tools_json, template_kwargs_json);
  if (!out.ok()) return out;
  const std::string_view final_message = Strip(messages.back().content);
  const std::string_view tag = Strip(kTag);
  const size_t at = out->rfind(tag);
  if (at == std::string::npos || out->find(final_message) == std::string::npos) {
    return absl::InvalidArgumentError(
        "continue_final_message: the chat template drops part of the final message");
  }
  const bool spaced = out->compare(at, kTag.size(), kTag) == 0;  // the template kept the space
  out->resize(at);
  if (!spaced) {
    while (!out->empty() && std::isspace(static_cast<unsigned char>(out->back()))) out->pop_back();
  }
  return out;
}

namespace {
absl::StatusOr<std::string> Render(const TokenizerData& data,
                                   const std::vector<ChatMessage>& messages,
                                   bool add_generation_prompt, std::string_view tools_json,
                                   std::string_view template_kwargs_json) {
  // The tool calls and tools are checked first, so a bad one is refused whatever the template.
  using Json = nlohmann::ordered_json;
  auto parse = [](std::string_view text, const std::string& what) -> absl::StatusOr<Json> {
    if (!JsonAffordable(text, 32)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": nested deeper than 32 levels or objects of too many members"));
    }
    Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": not a JSON array"));
    }
    return j;
  };
  Json list = Json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    Json message = {{"role", m.role}, {"content", m.content}};
    if (!m.tool_calls_json.empty()) {
      absl::StatusOr<Json> calls =
          parse(m.tool_calls_json, absl::StrCat("messages[", i, "].tool_calls"));
      if (!calls.ok()) return calls.status();
      // Templates read a call's arguments as an object (transformers' convention); OpenAI
      // sends them as a JSON string.
      for (Json& call : *calls) {
        if (!call.is_object() || !call.contains("function")) continue;
        Json& function = call["function"];
        // (Strings are not measured by the check above: bound the arguments' own nesting, since
        // templates dump them recursively, and their objects; others stay a string.)
        if (function.is_object() && function.contains("arguments") &&
            function["arguments"].is_string() &&
            JsonAffordable(function["arguments"].get<std::string>(), 32)) {
          Json args = Json::parse(function["arguments"].get<std::string>(), nullptr, false);
          if (!args.is_discarded()) function["arguments"] = std::move(args);
        }
      }
      message["tool_calls"] = std::move(*calls);
    }
    if (!m.tool_call_id.empty()) message["tool_call_id"] = m.tool_call_id;
    if (!m.reasoning_content.empty()) message["reasoning_content"] = m.reasoning_content;
    list.push_back(std::move(message));
  }
  Json variables = {{"messages", std::move(list)},
                    {"add_generation_prompt", add_generation_prompt},
                    {"bos_token", TokenText(data, data.bos_id)},
                    {"eos_token", TokenText(data, data.eos_id)}};
  if (!template_kwargs_json.empty()) {  // checked by RenderChat
    Json kwargs = Json::parse(template_kwargs_json);
    for (auto& [key, value] : kwargs.items()) variables[key] = std::move(value);
  }
  if (!tools_json.empty()) {
    absl::StatusOr<Json> tools = parse(tools_json, "tools");
    if (!tools.ok()) return tools.status();
    variables["tools"] = std::move(*tools);
  }
  if (data.chat_template.empty()) return PlainChatMl(messages, add_generation_prompt);
  absl::StatusOr<jinja::Template> t = jinja::Template::Parse(data.chat_template);
  if (!t.ok()) {
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true)) {
      TS_LOG(WARNING) << t.status().message() << "; chat prompts are rendered as plain ChatML";
    }
    return PlainChatMl(messages, add_generation_prompt);
  }
  absl::StatusOr<std::string> out = t->Render(variables);
  if (!out.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model's chat template refused the messages: ", out.status().message()));
  }
  return out;
}
}  // namespace

}  // namespace tinyserve
