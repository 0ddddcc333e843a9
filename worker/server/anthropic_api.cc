#include "worker/server/anthropic_api.h"

#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json_nesting.h"
#include "common/status.h"
#include "worker/server/openai_fields.h"
#include "worker/server/status_convert.h"

namespace tinyserve::openai {
namespace {

using json = Json;
namespace v1 = tinyserve::v1;

// The text of a tool_result's or system's content: a string, or text blocks joined by newlines.
absl::StatusOr<std::string> BlocksText(const json& content, const std::string& at) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return Bad(at, "must be a string or a list of text blocks");
  std::vector<std::string> parts;
  for (size_t k = 0; k < content.size(); ++k) {
    const json& block = content[k];
    const std::string bat = absl::StrCat(at, "[", k, "]");
    if (StringField(block, "type") != "text") return Bad(bat + ".type", "only text blocks here");
    auto text = block.find("text");
    if (text == block.end() || !text->is_string()) return Bad(bat + ".text", "must be a string");
    parts.push_back(text->get<std::string>());
  }
  return absl::StrJoin(parts, "\n");
}

// system and messages as chat messages: a user turn's tool_result blocks become tool messages
// (before its text), an assistant turn's tool_use blocks its tool_calls.
absl::Status Messages(const json& root, json* out) {
  if (auto system = root.find("system"); system != root.end() && !system->is_null()) {
    TS_ASSIGN_OR_RETURN(std::string text, BlocksText(*system, "system"));
    out->push_back({{"role", "system"}, {"content", std::move(text)}});
  }
  auto messages = root.find("messages");
  if (messages == root.end() || !messages->is_array() || messages->empty()) {
    return Bad("messages", "must be a non-empty list");
  }
  std::set<std::string> open_calls;  // the previous assistant turn's tool_use ids
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string at = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return Bad(at, "must be an object");
    const std::string role = StringField(m, "role");
    if (role != "user" && role != "assistant")
      return Bad(at + ".role", "must be user or assistant");
    auto content = m.find("content");
    if (content == m.end() || content->is_null()) return Bad(at + ".content", "is required");
    std::set<std::string> calls_here;
    if (content->is_string()) {
      out->push_back({{"role", role}, {"content", *content}});
      open_calls.clear();
      continue;
    }
    if (!content->is_array() || content->empty()) {
      return Bad(at + ".content", "must be a string or a non-empty list of blocks");
    }
    std::vector<std::string> texts;
    std::string thinking;  // an assistant turn's thinking blocks: its reasoning_content
    json calls = json::array();
    for (size_t k = 0; k < content->size(); ++k) {
      const json& block = (*content)[k];
      const std::string bat = absl::StrCat(at, ".content[", k, "]");
      const std::string type = StringField(block, "type");
      if (type == "text") {
        auto text = block.find("text");
        if (text == block.end() || !text->is_string())
          return Bad(bat + ".text", "must be a string");
        texts.push_back(text->get<std::string>());
      } else if (type == "tool_use" && role == "assistant") {
        const std::string id = StringField(block, "id"), name = StringField(block, "name");
        if (id.empty()) return Bad(bat + ".id", "is required");
        if (name.empty()) return Bad(bat + ".name", "is required");
        auto input = block.find("input");
        if (input == block.end() || !input->is_object())
          return Bad(bat + ".input", "must be an object");
        calls_here.insert(id);
        calls.push_back({{"id", id},
                         {"type", "function"},
                         {"function", {{"name", name}, {"arguments", Dump(*input)}}}});
      } else if (type == "tool_result" && role == "user") {
        const std::string id = StringField(block, "tool_use_id");
        if (id.empty()) return Bad(bat + ".tool_use_id", "is required");
        // As Anthropic's API: a result answers a call of the turn just before.
        if (open_calls.count(id) == 0)
          return Bad(bat + ".tool_use_id",
                     absl::StrCat("\"", id.substr(0, 64),
                                  "\" is not a tool_use id of the previous assistant turn"));
        std::string text;
        if (auto c = block.find("content"); c != block.end() && !c->is_null()) {
          TS_ASSIGN_OR_RETURN(text, BlocksText(*c, bat + ".content"));
        }
        out->push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", std::move(text)}});
      } else if (type == "thinking" && role == "assistant") {
        thinking += StringField(block, "thinking");
      } else if (type == "thinking" || type == "redacted_thinking") {
        continue;  // redacted (encrypted): nothing to read
      } else {
        return Bad(bat + ".type",
                   absl::StrCat("\"", type.substr(0, 40), "\" is not supported in a ", role,
                                " turn (text, tool_use in assistant turns, tool_result in user "
                                "turns)"));
      }
    }
    open_calls = std::move(calls_here);
    if (role == "assistant") {
      json msg = {{"role", "assistant"},
                  {"content", texts.empty() && !calls.empty() ? json(nullptr)
                                                              : json(absl::StrJoin(texts, "\n"))}};
      if (!calls.empty()) msg["tool_calls"] = std::move(calls);
      if (!thinking.empty()) msg["reasoning_content"] = std::move(thinking);
      out->push_back(std::move(msg));
    } else if (!texts.empty()) {
      out->push_back({{"role", "user"}, {"content", absl::StrJoin(texts, "\n")}});
    }
  }
  return absl::OkStatus();
}

// Client tools ({"name", "description", "input_schema"}) as chat's, and tool_choice.
absl::Status Tools(const json& root, json* chat) {
  if (auto tools = root.find("tools"); tools != root.end() && !tools->is_null()) {
    if (!tools->is_array()) return Bad("tools", "must be a list");
    json list = json::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& tool = (*tools)[i];
      const std::string at = absl::StrCat("tools[", i, "]");
      if (!tool.is_object()) return Bad(at, "must be an object");
      const std::string type = StringField(tool, "type");
      if (!type.empty() && type != "custom") {
        return Bad(at + ".type", absl::StrCat("only client tools are supported (server tools "
                                              "run at Anthropic), got \"",
                                              type.substr(0, 40), "\""));
      }
      json fn = json::object();
      if (auto v = tool.find("name"); v != tool.end()) fn["name"] = *v;
      if (auto v = tool.find("description"); v != tool.end()) fn["description"] = *v;
      if (auto v = tool.find("input_schema"); v != tool.end()) fn["parameters"] = *v;
      list.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    (*chat)["tools"] = std::move(list);
  }
  if (auto choice = root.find("tool_choice"); choice != root.end() && !choice->is_null()) {
    const std::string type = StringField(*choice, "type");
    if (type == "auto" || type == "none") {
      (*chat)["tool_choice"] = type;
    } else if (type == "any") {
      (*chat)["tool_choice"] = "required";
    } else if (type == "tool") {
      (*chat)["tool_choice"] = {{"type", "function"},
                                {"function", {{"name", StringField(*choice, "name")}}}};
    } else {
      return Bad("tool_choice.type", "must be auto, any, tool or none");
    }
  }
  return absl::OkStatus();
}

// output_config: format as chat's response_format; effort refused (the model does not reason).
absl::Status OutputConfig(const json& root, json* chat) {
  auto config = root.find("output_config");
  if (config == root.end() || config->is_null()) return absl::OkStatus();
  if (!config->is_object()) return Bad("output_config", "must be an object");
  if (auto effort = config->find("effort"); effort != config->end() && !effort->is_null()) {
    return Bad("output_config.effort", "is not supported: the model does not reason");
  }
  auto format = config->find("format");
  if (format == config->end() || format->is_null()) return absl::OkStatus();
  if (StringField(*format, "type") != "json_schema") {
    return Bad("output_config.format.type", "must be json_schema");
  }
  auto schema = format->find("schema");
  if (schema == format->end() || schema->is_null()) {
    return Bad("output_config.format.schema", "is required");
  }
  (*chat)["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"schema", *schema}}}};
  return absl::OkStatus();
}

// A chat field's name as the Messages API names it.
std::string MessagesField(const std::string& field) {
  static constexpr std::pair<const char*, const char*> kPrefixes[] = {
      {"max_completion_tokens", "max_tokens"},
      {"stop", "stop_sequences"},
      {"tool_choice.function.", "tool_choice."},
      {"response_format.json_schema.schema", "output_config.format.schema"},
      {"response_format", "output_config.format"},
      {"thinking_token_budget", "thinking.budget_tokens"},
  };
  std::string flat = FlatToolField(field);
  if (flat.empty()) return RenamePrefix(field, kPrefixes);
  // tools[i].parameters... -> tools[i].input_schema...
  const size_t dot = flat.find("].parameters");
  if (dot != std::string::npos) flat.replace(dot + 2, 10, "input_schema");
  return flat;
}

}  // namespace

absl::StatusOr<ParsedRequest> ParseMessagesRequest(std::string_view body, const ServedModel& model,
                                                   const std::string& request_id, bool count_only) {
  TS_ASSIGN_OR_RETURN(const json root, ParseBody(body));
  Fields f(root, "");
  const std::optional<int64_t> max_tokens =
      f.Integer("max_tokens", 1, std::numeric_limits<int32_t>::max());
  // Extended thinking: the model thinks or not by its chat template (Qwen3:
  // chat_template_kwargs); with --reasoning-parser its <think> block comes back as a thinking
  // block, closed after budget_tokens (the chat request's thinking_token_budget).
  std::optional<int64_t> thinking_budget;
  if (const json* thinking = f.Get("thinking")) {
    const std::string type = thinking->is_object() ? StringField(*thinking, "type") : "";
    if (type != "disabled" && (type != "enabled" || model.reasoning_parser.empty())) {
      return Bad("thinking", type == "enabled" ? "needs a server started with --reasoning-parser"
                                               : "must be {\"type\": \"enabled\" or \"disabled\"}");
    }
    if (type == "enabled") {
      Fields tf(*thinking, "thinking.");
      thinking_budget = tf.Integer("budget_tokens", 0, std::numeric_limits<int32_t>::max());
      TS_RETURN_IF_ERROR(tf.status());
    }
  }
  std::optional<bool> disable_parallel;
  if (const json* choice = f.Get("tool_choice"); choice != nullptr && choice->is_object()) {
    Fields cf(*choice, "tool_choice.");
    disable_parallel = cf.Bool("disable_parallel_tool_use");
    TS_RETURN_IF_ERROR(cf.status());
  }
  json stop = json::array();
  if (const json* s = f.Get("stop_sequences")) {
    if (!s->is_array()) return Bad("stop_sequences", "must be a list of strings");
    for (const json& x : *s) {
      if (!x.is_string()) return Bad("stop_sequences", "must be a list of strings");
      stop.push_back(x);
    }
  }
  TS_RETURN_IF_ERROR(f.status());
  if (!max_tokens.has_value() && !count_only) return Bad("max_tokens", "is required");

  json chat = json::object();
  for (const char* key : kChatExtras) {
    if (auto it = root.find(key); it != root.end()) chat[key] = *it;
  }
  json messages = json::array();
  TS_RETURN_IF_ERROR(Messages(root, &messages));
  chat["messages"] = std::move(messages);
  TS_RETURN_IF_ERROR(Tools(root, &chat));
  TS_RETURN_IF_ERROR(OutputConfig(root, &chat));
  if (max_tokens.has_value()) chat["max_completion_tokens"] = *max_tokens;
  if (thinking_budget.has_value()) chat["thinking_token_budget"] = *thinking_budget;
  if (!stop.empty()) chat["stop"] = std::move(stop);
  auto parsed = ParseRequestJson(Endpoint::kChat, chat, model, request_id);
  if (!parsed.ok()) return RenamedField(parsed.status(), MessagesField);
  ParsedRequest out = *std::move(parsed);
  out.endpoint = Endpoint::kMessages;
  out.responses = {{"disable_parallel_tool_use", disable_parallel.value_or(false)}};
  return out;
}

Json AnthropicErrorBody(const absl::Status& status) {
  const char* type = "api_error";
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      type = "invalid_request_error";
      break;
    case absl::StatusCode::kUnauthenticated:
      type = "authentication_error";
      break;
    case absl::StatusCode::kPermissionDenied:
      type = "permission_error";
      break;
    case absl::StatusCode::kNotFound:
      type = "not_found_error";
      break;
    case absl::StatusCode::kResourceExhausted:
      type = "rate_limit_error";
      break;
    case absl::StatusCode::kUnavailable:
      type = "overloaded_error";
      break;
    default:
      break;
  }
  return {{"type", "error"}, {"error", {{"type", type}, {"message", status.message()}}}};
}

MessagesBuilder::MessagesBuilder(const ParsedRequest& request, std::string id)
    : chat_request_(AsChatRequest(request)), chat_(chat_request_, id, 0), id_(std::move(id)) {}

size_t MessagesBuilder::MaxCalls() const {
  const json& r = chat_request_.responses;
  return r.value("disable_parallel_tool_use", false) ? 1 : std::numeric_limits<size_t>::max();
}

Json MessagesBuilder::ToolUse(const json& call) const {
  const std::string call_id = call["id"].get<std::string>();
  // The arguments are the model's output (held to a schema, or parsed from a tool-call block):
  // bounded before parsing as every untrusted text is.
  const std::string& arguments = call["function"]["arguments"].get_ref<const std::string&>();
  json input = JsonAffordable(arguments, kMaxJsonDepth)
                   ? json::parse(arguments, nullptr, /*allow_exceptions=*/false)
                   : json(nullptr);
  if (input.is_discarded() || !input.is_object()) input = json::object();
  return {{"type", "tool_use"},
          {"id", absl::StrCat("toolu_", call_id.substr(call_id.find('_') + 1))},
          {"name", call["function"]["name"]},
          {"input", std::move(input)}};
}

Json MessagesBuilder::Usage(const json& chat) const {
  return {{"input_tokens", chat["prompt_tokens"]},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", chat["prompt_tokens_details"]["cached_tokens"]},
          {"output_tokens", chat["completion_tokens"]}};
}

std::pair<std::string, Json> MessagesBuilder::StopReason(const std::string& finish,
                                                         const Json& stop_reason) const {
  if (calls_ > 0 || finish == "tool_calls") return {"tool_use", nullptr};
  if (finish == "length") return {"max_tokens", nullptr};
  if (finish == "stop" && stop_reason.is_string()) return {"stop_sequence", stop_reason};
  if (finish == "abort") return {"abort", nullptr};
  return {"end_turn", nullptr};
}

std::string MessagesBuilder::Body() const {
  const json chat = chat_.BodyJson();
  const json& choice = chat["choices"][0];
  const json& message = choice["message"];
  const bool has_calls = message.contains("tool_calls") && message["tool_calls"].is_array();
  json content = json::array();
  if (message.contains("reasoning_content") && message["reasoning_content"].is_string())
    content.push_back(
        {{"type", "thinking"}, {"thinking", message["reasoning_content"]}, {"signature", ""}});
  if (message["content"].is_string() &&
      (!has_calls || !message["content"].get<std::string>().empty())) {
    content.push_back({{"type", "text"}, {"text", message["content"]}});
  }
  size_t calls = 0;
  if (has_calls) {
    for (const json& call : message["tool_calls"]) {
      if (calls == MaxCalls()) break;
      content.push_back(ToolUse(call));
      ++calls;
    }
  }
  auto [stop, sequence] =
      calls > 0 ? std::pair<std::string, json>{"tool_use", nullptr}
                : StopReason(choice["finish_reason"].get<std::string>(), choice["stop_reason"]);
  json body = {{"id", id_},
               {"type", "message"},
               {"role", "assistant"},
               {"model", chat_request_.model},
               {"content", std::move(content)},
               {"stop_reason", stop},
               {"stop_sequence", sequence},
               {"usage", Usage(chat["usage"])},
               {"tinyserve", choice["tinyserve"]}};
  return Dump(body);
}

void MessagesBuilder::Emit(const std::string& type, json fields) {
  json e = {{"type", type}};
  for (auto& [key, value] : fields.items()) e[key] = std::move(value);
  absl::StrAppend(&pending_, "event: ", type, "\ndata: ", Dump(e), "\n\n");
}

std::string MessagesBuilder::Flush() { return std::exchange(pending_, std::string()); }

void MessagesBuilder::Start() {
  if (started_) return;
  started_ = true;
  Emit("message_start", {{"message",
                          {{"id", id_},
                           {"type", "message"},
                           {"role", "assistant"},
                           {"model", chat_request_.model},
                           {"content", json::array()},
                           {"stop_reason", nullptr},
                           {"stop_sequence", nullptr},
                           {"usage", {{"input_tokens", 0}, {"output_tokens", 0}}}}}});
}

void MessagesBuilder::CloseBlock() {
  if (!text_open_) return;
  text_open_ = thinking_open_ = false;
  Emit("content_block_stop", {{"index", blocks_ - 1}});
}

void MessagesBuilder::AddToolUse(const json& call) {
  CloseBlock();
  json block = ToolUse(call);
  const std::string input = Dump(block["input"]);
  block["input"] = json::object();
  const int index = blocks_++;
  Emit("content_block_start", {{"index", index}, {"content_block", std::move(block)}});
  Emit("content_block_delta",
       {{"index", index}, {"delta", {{"type", "input_json_delta"}, {"partial_json", input}}}});
  Emit("content_block_stop", {{"index", index}});
  ++calls_;
}

std::string MessagesBuilder::OnResponse(int index, const v1::GenerateResponse& response) {
  const std::vector<json> chunks = chat_.Chunks(index, response);
  if (!chat_request_.stream) return "";
  Start();
  for (const json& chunk : chunks) {
    for (const json& choice : chunk["choices"]) {
      const json& delta = choice["delta"];
      auto content = delta.find("content");
      if (auto thought = delta.find("reasoning_content"); thought != delta.end()) {
        if (!thinking_open_) {
          CloseBlock();
          thinking_open_ = text_open_ = true;  // CloseBlock closes either
          Emit("content_block_start",
               {{"index", blocks_++},
                {"content_block", {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}}});
        }
        Emit("content_block_delta",
             {{"index", blocks_ - 1},
              {"delta", {{"type", "thinking_delta"}, {"thinking", *thought}}}});
      }
      if (content != delta.end() && content->is_string() && !content->get<std::string>().empty()) {
        if (thinking_open_) CloseBlock();
        if (!text_open_) {
          text_open_ = true;
          Emit("content_block_start",
               {{"index", blocks_++}, {"content_block", {{"type", "text"}, {"text", ""}}}});
        }
        Emit("content_block_delta",
             {{"index", blocks_ - 1}, {"delta", {{"type", "text_delta"}, {"text", *content}}}});
      }
      if (auto calls = delta.find("tool_calls"); calls != delta.end() && calls->is_array()) {
        for (const json& call : *calls) {
          if (calls_ < MaxCalls()) AddToolUse(call);
        }
      }
      if (choice["finish_reason"].is_string()) {
        finish_ = choice["finish_reason"];
        stop_reason_ = choice.value("stop_reason", json(nullptr));
      }
    }
  }
  return Flush();
}

std::string MessagesBuilder::OnFailure(int index, const grpc::Status& status) {
  chat_.OnFailure(index, status);
  failure_ = status;
  if (!chat_request_.stream) return "";
  Start();
  Emit("error", {{"error", AnthropicErrorBody(ToAbslStatus(status))["error"]}});
  return Flush();
}

std::string MessagesBuilder::StreamEnd() {
  Start();
  if (failure_.has_value()) return Flush();  // the error event ended it
  if (blocks_ == 0) {                        // an empty answer is one empty text block
    text_open_ = true;
    Emit("content_block_start",
         {{"index", blocks_++}, {"content_block", {{"type", "text"}, {"text", ""}}}});
  }
  CloseBlock();
  auto [stop, sequence] = StopReason(finish_, stop_reason_);
  Emit("message_delta", {{"delta", {{"stop_reason", stop}, {"stop_sequence", sequence}}},
                         {"usage", Usage(chat_.Usage())}});
  Emit("message_stop", json::object());
  return Flush();
}

}  // namespace tinyserve::openai
