#include "worker/server/openai_responses.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "worker/server/openai_fields.h"

namespace tinyserve::openai {
namespace {

using json = Json;
namespace v1 = tinyserve::v1;

constexpr char kLogprobsInclude[] = "message.output_text.logprobs";

// The text of a message's content: a string, or a list of text parts (input_text,
// output_text, refusal), joined by newlines as chat joins its parts.
absl::StatusOr<std::string> TextOf(const json& content, const std::string& at) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return Bad(at, "must be a string or a list of text parts");
  std::vector<std::string> parts;
  for (size_t k = 0; k < content.size(); ++k) {
    const json& part = content[k];
    const std::string pat = absl::StrCat(at, "[", k, "]");
    const std::string type = StringField(part, "type");
    const char* key = type == "refusal" ? "refusal" : "text";
    if (type != "input_text" && type != "output_text" && type != "text" && type != "refusal") {
      return Bad(pat + ".type", absl::StrCat("only text parts (input_text, output_text) are "
                                             "supported, got \"",
                                             type.substr(0, 40), "\""));
    }
    auto text = part.find(key);
    if (text == part.end() || !text->is_string()) {
      return Bad(absl::StrCat(pat, ".", key), "must be a string");
    }
    parts.push_back(text->get<std::string>());
  }
  return absl::StrJoin(parts, "\n");
}

// The request's input as a list of items (a string is one user message).
absl::StatusOr<json> InputItems(const json& root) {
  auto input = root.find("input");
  if (input == root.end() || input->is_null()) return Bad("input", "is required");
  if (input->is_string()) {
    return json::array({{{"type", "message"}, {"role", "user"}, {"content", *input}}});
  }
  if (!input->is_array() || input->empty()) {
    return Bad("input", "must be a string or a non-empty list of items");
  }
  return *input;
}

// Input items as chat messages, appended to *messages; errors name them field[i].
absl::Status AddItems(const json& items, const std::string& field, json* messages) {
  for (size_t i = 0; i < items.size(); ++i) {
    const json& item = items[i];
    const std::string at = absl::StrCat(field, "[", i, "]");
    if (!item.is_object()) return Bad(at, "must be an object");
    const std::string type = StringField(item, "type");
    if (type.empty() || type == "message") {
      const std::string role = StringField(item, "role");
      if (role != "user" && role != "system" && role != "developer" && role != "assistant") {
        return Bad(at + ".role", "must be user, system, developer or assistant");
      }
      auto content = item.find("content");
      if (content == item.end()) return Bad(at + ".content", "is required");
      TS_ASSIGN_OR_RETURN(std::string text, TextOf(*content, at + ".content"));
      json* last = messages->empty() ? nullptr : &messages->back();
      if (role == "assistant" && last != nullptr && last->contains("reasoning_content") &&
          (*last)["content"] == "" && !last->contains("tool_calls")) {
        (*last)["content"] = std::move(text);  // the answer after its reasoning item
      } else {
        messages->push_back({{"role", role}, {"content", std::move(text)}});
      }
    } else if (type == "function_call") {
      for (const char* key : {"call_id", "name", "arguments"}) {
        auto v = item.find(key);
        if (v == item.end() || !v->is_string())
          return Bad(absl::StrCat(at, ".", key), "must be a string");
      }
      json call = {{"id", item["call_id"]},
                   {"type", "function"},
                   {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}};
      // Calls of one turn join the assistant message before them, as chat has them.
      json* last = messages->empty() ? nullptr : &messages->back();
      if (last != nullptr && (*last)["role"] == "assistant") {
        if (!last->contains("tool_calls")) (*last)["tool_calls"] = json::array();
        (*last)["tool_calls"].push_back(std::move(call));
      } else {
        messages->push_back(
            {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {std::move(call)}}});
      }
    } else if (type == "function_call_output") {
      const std::string call_id = StringField(item, "call_id");
      if (call_id.empty()) return Bad(at + ".call_id", "is required");
      auto output = item.find("output");
      if (output == item.end()) return Bad(at + ".output", "is required");
      TS_ASSIGN_OR_RETURN(std::string text, TextOf(*output, at + ".output"));
      messages->push_back(
          {{"role", "tool"}, {"tool_call_id", call_id}, {"content", std::move(text)}});
    } else if (type == "reasoning") {
      // A reasoning model's thinking: the reasoning_content of the assistant turn it begins
      // (its reasoning_text parts, else its summary's text).
      std::string text;
      for (const char* key : {"content", "summary"}) {
        auto parts = item.find(key);
        if (!text.empty() || parts == item.end() || !parts->is_array()) continue;
        for (const json& part : *parts) text += StringField(part, "text");
      }
      if (!text.empty())
        messages->push_back({{"role", "assistant"}, {"content", ""}, {"reasoning_content", text}});
    } else if (type == "item_reference") {
      return Bad(at,
                 "item references are not supported: send the items themselves, or continue a "
                 "stored response with previous_response_id");
    } else {
      return Bad(at + ".type", absl::StrCat("\"", type.substr(0, 40),
                                            "\" is not supported (message, function_call, "
                                            "function_call_output)"));
    }
  }
  return absl::OkStatus();
}

// Flat function tools ({"type": "function", "name", "parameters"}) as chat's, and tool_choice.
absl::Status Tools(const json& root, json* chat) {
  if (auto tools = root.find("tools"); tools != root.end() && !tools->is_null()) {
    if (!tools->is_array()) return Bad("tools", "must be a list");
    json list = json::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& tool = (*tools)[i];
      const std::string at = absl::StrCat("tools[", i, "]");
      const std::string type = StringField(tool, "type");
      if (type != "function") {
        return Bad(at + ".type", absl::StrCat("only function tools are supported, got \"",
                                              type.substr(0, 40), "\""));
      }
      json fn = json::object();
      for (const char* key : {"name", "description", "parameters"}) {
        if (auto v = tool.find(key); v != tool.end()) fn[key] = *v;
      }
      list.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    (*chat)["tools"] = std::move(list);
  }
  if (auto choice = root.find("tool_choice"); choice != root.end() && !choice->is_null()) {
    if (choice->is_string()) {
      (*chat)["tool_choice"] = *choice;
    } else if (StringField(*choice, "type") == "function" && choice->contains("name")) {
      (*chat)["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*choice)["name"]}}}};
    } else {
      return Bad("tool_choice",
                 "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\": "
                 "...}");
    }
  }
  return absl::OkStatus();
}

// text.format as chat's response_format.
absl::Status TextFormat(const json& root, json* chat) {
  auto text = root.find("text");
  if (text == root.end() || text->is_null()) return absl::OkStatus();
  if (!text->is_object()) return Bad("text", "must be an object");
  auto format = text->find("format");
  if (format == text->end() || format->is_null()) return absl::OkStatus();
  const std::string type = StringField(*format, "type");
  if (type == "json_object") {
    (*chat)["response_format"] = {{"type", "json_object"}};
  } else if (type == "json_schema") {
    auto schema = format->find("schema");
    if (schema == format->end() || schema->is_null())
      return Bad("text.format.schema", "is required");
    (*chat)["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"schema", *schema}}}};
  } else if (type != "text") {
    return Bad("text.format.type", "must be text, json_object or json_schema");
  }
  return absl::OkStatus();
}

// A chat field's name as the Responses API names it.
std::string ResponsesField(const std::string& field) {
  static constexpr std::pair<const char*, const char*> kPrefixes[] = {
      {"max_completion_tokens", "max_output_tokens"},
      {"response_format.json_schema.schema", "text.format.schema"},
      {"response_format", "text.format"},
      {"tool_choice.function.", "tool_choice."},
      {"messages", "input"},
      {"reasoning_effort", "reasoning.effort"},
  };
  const std::string flat = FlatToolField(field);
  return flat.empty() ? RenamePrefix(field, kPrefixes) : flat;
}

json UsageOf(const json& chat) {
  return {
      {"input_tokens", chat["prompt_tokens"]},
      {"input_tokens_details", {{"cached_tokens", chat["prompt_tokens_details"]["cached_tokens"]}}},
      {"output_tokens", chat["completion_tokens"]},
      {"output_tokens_details", {{"reasoning_tokens", 0}}},
      {"total_tokens", chat["total_tokens"]}};
}

std::string StatusOf(const std::string& finish) {
  return finish == "length" || finish == "abort" ? "incomplete" : "completed";
}

}  // namespace

absl::StatusOr<ParsedRequest> ParseResponsesRequest(std::string_view body, const ServedModel& model,
                                                    const std::string& request_id,
                                                    ResponseStore* store) {
  TS_ASSIGN_OR_RETURN(const json root, ParseBody(body));
  Fields f(root, "");
  f.RejectUnless("previous_response_id", store != nullptr,
                 "needs stored responses, which this server does not keep (--responses-store-mb "
                 "0): send the whole conversation as input");
  f.RejectUnless("conversation", false,
                 "is not supported (the Conversations API is not served): continue a response "
                 "with previous_response_id, or send the whole conversation as input");
  f.RejectUnless("background", !f.Bool("background").value_or(false), "is not supported");
  f.RejectUnless("prompt", false, "is not supported (reusable prompts are stored by OpenAI)");
  f.RejectUnless("truncation", f.String("truncation").value_or("") == "disabled",
                 "only \"disabled\" is supported (a prompt past the context is an error)");
  // reasoning.effort is chat's reasoning_effort: a chat template variable (vLLM's rule).
  json effort = nullptr;
  if (const json* reasoning = f.Get("reasoning")) {
    if (!reasoning->is_object()) return Bad("reasoning", "must be an object");
    Fields rf(*reasoning, "reasoning.");
    if (std::optional<std::string> e = rf.String("effort")) effort = *e;
    TS_RETURN_IF_ERROR(rf.status());
  }
  const std::optional<int64_t> max_output =
      f.Integer("max_output_tokens", 1, std::numeric_limits<int32_t>::max());
  const std::optional<int64_t> top_logprobs = f.Integer("top_logprobs", 0, 20);
  f.Integer("max_tool_calls", 1, 128);  // echoed; MaxCalls() reads it
  const std::optional<bool> parallel = f.Bool("parallel_tool_calls");
  const bool keep = f.Bool("store").value_or(true) && store != nullptr;
  const std::optional<std::string> previous = f.String("previous_response_id");
  f.RejectUnless("previous_response_id", !previous.has_value() || !previous->empty(),
                 "must not be empty");
  bool want_logprobs = top_logprobs.has_value();
  if (const json* include = f.Get("include")) {
    if (!include->is_array()) return Bad("include", "must be a list of strings");
    for (const json& x : *include) {
      if (!x.is_string()) return Bad("include", "must be a list of strings");
      // Other entries name items this server never makes (tool outputs, encrypted reasoning).
      if (x == kLogprobsInclude) want_logprobs = true;
    }
  }
  json metadata = json::object();
  if (const json* m = f.Get("metadata")) {
    if (!m->is_object() || m->size() > 16)
      return Bad("metadata", "must be an object of at most 16 strings");
    for (const auto& [key, value] : m->items()) {
      if (!value.is_string()) return Bad("metadata", "must be an object of at most 16 strings");
    }
    metadata = *m;
  }
  for (const char* key : {"user", "safety_identifier", "prompt_cache_key", "service_tier"}) {
    f.String(key);
  }
  TS_RETURN_IF_ERROR(f.status());

  json chat = json::object();
  for (const char* key : kChatExtras) {
    if (auto it = root.find(key); it != root.end()) chat[key] = *it;
  }
  // Instructions, then the conversation continued (its own instructions are not carried
  // over), then this request's input.
  if (!effort.is_null()) chat["reasoning_effort"] = effort;
  json messages = json::array();
  if (auto it = root.find("instructions"); it != root.end() && !it->is_null()) {
    if (!it->is_string()) return Bad("instructions", "must be a string");
    messages.push_back({{"role", "system"}, {"content", *it}});
  }
  if (previous.has_value()) {
    auto history = store->Conversation(*previous);
    if (!history.ok()) return Bad("previous_response_id", history.status().message());
    TS_RETURN_IF_ERROR(AddItems(*history, "previous_response_id", &messages));
  }
  TS_ASSIGN_OR_RETURN(json input, InputItems(root));
  TS_RETURN_IF_ERROR(AddItems(input, "input", &messages));
  chat["messages"] = std::move(messages);
  TS_RETURN_IF_ERROR(Tools(root, &chat));
  TS_RETURN_IF_ERROR(TextFormat(root, &chat));
  if (max_output.has_value()) chat["max_completion_tokens"] = *max_output;
  if (want_logprobs) {
    chat["logprobs"] = true;
    chat["top_logprobs"] = top_logprobs.value_or(0);
  }
  auto parsed = ParseRequestJson(Endpoint::kChat, chat, model, request_id);
  if (!parsed.ok()) return RenamedField(parsed.status(), ResponsesField);
  ParsedRequest out = *std::move(parsed);
  out.endpoint = Endpoint::kResponses;
  out.responses_input = std::move(input);

  auto echo = [&](const char* key, json fallback) {
    auto it = root.find(key);
    return it == root.end() || it->is_null() ? fallback : *it;
  };
  json format = {{"type", "text"}};
  if (auto text = root.find("text"); text != root.end() && text->is_object() &&
                                     text->contains("format") && !(*text)["format"].is_null()) {
    format = (*text)["format"];
  }
  out.responses = {{"instructions", echo("instructions", nullptr)},
                   {"max_output_tokens", echo("max_output_tokens", nullptr)},
                   {"max_tool_calls", echo("max_tool_calls", nullptr)},
                   {"metadata", std::move(metadata)},
                   {"parallel_tool_calls", parallel.value_or(true)},
                   {"previous_response_id", previous.has_value() ? json(*previous) : json()},
                   {"reasoning", {{"effort", effort}, {"summary", nullptr}}},
                   {"service_tier", echo("service_tier", "default")},
                   {"store", keep},
                   {"temperature", echo("temperature", 1.0)},
                   {"text", {{"format", std::move(format)}}},
                   {"tool_choice", echo("tool_choice", "auto")},
                   {"tools", echo("tools", json::array())},
                   {"top_logprobs", top_logprobs.value_or(0)},
                   {"top_p", echo("top_p", 1.0)},
                   {"truncation", "disabled"},
                   {"user", echo("user", nullptr)}};
  return out;
}

ResponsesBuilder::ResponsesBuilder(const ParsedRequest& request, std::string id, int64_t created,
                                   std::string item_suffix)
    : chat_request_(AsChatRequest(request)),
      chat_(chat_request_, id, created),
      id_(std::move(id)),
      item_suffix_(item_suffix.empty() ? id_.substr(id_.find('_') + 1) : std::move(item_suffix)),
      created_(created) {}

size_t ResponsesBuilder::MaxCalls() const {
  const json& r = chat_request_.responses;
  if (r.contains("parallel_tool_calls") && r["parallel_tool_calls"] == false) return 1;
  if (r.contains("max_tool_calls") && r["max_tool_calls"].is_number_integer()) {
    return r["max_tool_calls"].get<size_t>();
  }
  return std::numeric_limits<size_t>::max();
}

json ResponsesBuilder::ResponseObject(const std::string& status, const std::string& finish,
                                      json output, const json& usage, const json& stats) const {
  json r = {{"id", id_},
            {"object", "response"},
            {"created_at", created_},
            {"status", status},
            {"background", false},
            {"error", nullptr},
            {"incomplete_details", nullptr},
            {"model", chat_request_.model},
            {"output", std::move(output)}};
  for (const auto& [key, value] : chat_request_.responses.items()) r[key] = value;
  if (status == "incomplete") {
    r["incomplete_details"] = {{"reason", finish == "length" ? "max_output_tokens" : finish}};
  }
  if (failure_.has_value()) {
    const json e = ErrorBody(*failure_)["error"];
    r["error"] = {{"code", e["code"]}, {"message", e["message"]}};
  }
  r["usage"] = usage;
  if (!stats.is_null()) r["tinyserve"] = stats;
  return r;
}

std::string ResponsesBuilder::MessageId() const { return absl::StrCat("msg_", item_suffix_); }

json ResponsesBuilder::MessageItem(const std::string& text, const json& logprobs,
                                   const std::string& status) const {
  json part = {{"type", "output_text"},
               {"text", text},
               {"annotations", json::array()},
               {"logprobs", logprobs.is_array() ? logprobs : json::array()}};
  return {{"id", MessageId()},
          {"type", "message"},
          {"status", status},
          {"role", "assistant"},
          {"content", json::array({std::move(part)})}};
}

std::string ResponsesBuilder::ReasoningId() const { return absl::StrCat("rs_", item_suffix_); }

json ResponsesBuilder::ReasoningItem(const std::string& text, const std::string& status) const {
  return {{"id", ReasoningId()},
          {"type", "reasoning"},
          {"summary", json::array()},
          {"content", json::array({{{"type", "reasoning_text"}, {"text", text}}})},
          {"encrypted_content", nullptr},
          {"status", status}};
}

void ResponsesBuilder::CloseReasoning() {
  if (!reasoning_open_) return;
  reasoning_open_ = false;
  const json item = ReasoningItem(reasoning_, "completed");
  const size_t index = output_.size();
  Emit("response.reasoning_text.done", {{"item_id", item["id"]},
                                        {"output_index", index},
                                        {"content_index", 0},
                                        {"text", reasoning_}});
  Emit("response.output_item.done", {{"output_index", index}, {"item", item}});
  output_.push_back(item);
}

json ResponsesBuilder::CallItem(const json& call, const std::string& status) const {
  const std::string call_id = call["id"].get<std::string>();
  return {{"id", absl::StrCat("fc_", call_id.substr(call_id.find('_') + 1))},
          {"type", "function_call"},
          {"status", status},
          {"arguments", call["function"]["arguments"]},
          {"call_id", call_id},
          {"name", call["function"]["name"]}};
}

std::string ResponsesBuilder::Body() const {
  const json chat = chat_.BodyJson();
  const json& choice = chat["choices"][0];
  const json& message = choice["message"];
  const std::string finish = choice["finish_reason"].get<std::string>();
  const bool calls = message.contains("tool_calls") && message["tool_calls"].is_array();
  json output = json::array();
  if (message.contains("reasoning_content") && message["reasoning_content"].is_string())
    output.push_back(ReasoningItem(message["reasoning_content"].get<std::string>(), "completed"));
  if (message["content"].is_string() &&
      (!calls || !message["content"].get<std::string>().empty())) {
    const json& lp = choice["logprobs"];
    output.push_back(MessageItem(message["content"].get<std::string>(),
                                 lp.is_object() ? lp["content"] : json::array(), StatusOf(finish)));
  }
  if (calls) {
    const size_t n = std::min(MaxCalls(), message["tool_calls"].size());
    for (size_t k = 0; k < n; ++k)
      output.push_back(CallItem(message["tool_calls"][k], "completed"));
  }
  final_ = ResponseObject(StatusOf(finish), finish, std::move(output), UsageOf(chat["usage"]),
                          choice["tinyserve"]);
  return Dump(final_);
}

void ResponsesBuilder::Emit(const std::string& type, json fields) {
  json e = {{"type", type}, {"sequence_number", sequence_++}};
  for (auto& [key, value] : fields.items()) e[key] = std::move(value);
  absl::StrAppend(&pending_, "event: ", type, "\ndata: ", Dump(e), "\n\n");
}

std::string ResponsesBuilder::Flush() { return std::exchange(pending_, std::string()); }

void ResponsesBuilder::Start() {
  if (started_) return;
  started_ = true;
  const json r = ResponseObject("in_progress", "", json::array(), nullptr, nullptr);
  Emit("response.created", {{"response", r}});
  Emit("response.in_progress", {{"response", r}});
}

void ResponsesBuilder::OpenMessage() {
  if (message_open_) return;
  message_open_ = true;
  json item = MessageItem("", json::array(), "in_progress");
  json part = item["content"][0];
  item["content"] = json::array();
  Emit("response.output_item.added", {{"output_index", output_.size()}, {"item", item}});
  Emit("response.content_part.added", {{"item_id", item["id"]},
                                       {"output_index", output_.size()},
                                       {"content_index", 0},
                                       {"part", std::move(part)}});
}

void ResponsesBuilder::CloseMessage() {
  if (!message_open_) return;
  message_open_ = false;
  json item = MessageItem(text_, text_logprobs_, finish_.empty() ? "completed" : StatusOf(finish_));
  const size_t index = output_.size();
  Emit("response.output_text.done", {{"item_id", item["id"]},
                                     {"output_index", index},
                                     {"content_index", 0},
                                     {"text", text_},
                                     {"logprobs", text_logprobs_}});
  Emit("response.content_part.done", {{"item_id", item["id"]},
                                      {"output_index", index},
                                      {"content_index", 0},
                                      {"part", item["content"][0]}});
  Emit("response.output_item.done", {{"output_index", index}, {"item", item}});
  output_.push_back(std::move(item));
}

void ResponsesBuilder::AddCall(const json& call) {
  json item = CallItem(call, "in_progress");
  const json arguments = item["arguments"];
  const size_t index = output_.size();
  item["arguments"] = "";
  Emit("response.output_item.added", {{"output_index", index}, {"item", item}});
  Emit("response.function_call_arguments.delta",
       {{"item_id", item["id"]}, {"output_index", index}, {"delta", arguments}});
  Emit("response.function_call_arguments.done",
       {{"item_id", item["id"]}, {"output_index", index}, {"arguments", arguments}});
  item["arguments"] = arguments;
  item["status"] = "completed";
  Emit("response.output_item.done", {{"output_index", index}, {"item", item}});
  output_.push_back(std::move(item));
  ++calls_;
}

std::string ResponsesBuilder::OnResponse(int index, const v1::GenerateResponse& response) {
  const std::vector<json> chunks = chat_.Chunks(index, response);
  if (!chat_request_.stream) return "";
  Start();
  for (const json& chunk : chunks) {
    for (const json& choice : chunk["choices"]) {
      const json& delta = choice["delta"];
      json lp = json::array();
      if (auto l = choice.find("logprobs"); l != choice.end() && l->is_object()) {
        lp = (*l)["content"];
      }
      auto calls = delta.find("tool_calls");
      auto content = delta.find("content");
      if (auto thought = delta.find("reasoning_content"); thought != delta.end()) {
        if (!reasoning_open_) {
          reasoning_open_ = true;
          json item = ReasoningItem("", "in_progress");
          item["content"] = json::array();
          Emit("response.output_item.added", {{"output_index", output_.size()}, {"item", item}});
        }
        reasoning_ += thought->get<std::string>();
        Emit("response.reasoning_text.delta", {{"item_id", ReasoningId()},
                                               {"output_index", output_.size()},
                                               {"content_index", 0},
                                               {"delta", *thought}});
      }
      if (content != delta.end() && content->is_string() && !content->get<std::string>().empty()) {
        CloseReasoning();
        OpenMessage();
        text_ += content->get<std::string>();
        for (const json& x : lp) text_logprobs_.push_back(x);
        Emit("response.output_text.delta", {{"item_id", MessageId()},
                                            {"output_index", output_.size()},
                                            {"content_index", 0},
                                            {"delta", *content},
                                            {"logprobs", std::move(lp)}});
      } else if (calls == delta.end()) {
        for (const json& x : lp) text_logprobs_.push_back(x);  // of text held back
      }
      if (calls != delta.end() && calls->is_array()) {
        CloseReasoning();
        CloseMessage();
        for (const json& call : *calls) {
          if (calls_ < MaxCalls()) AddCall(call);
        }
      }
      if (choice["finish_reason"].is_string()) finish_ = choice["finish_reason"];
    }
  }
  return Flush();
}

std::string ResponsesBuilder::OnFailure(int index, const grpc::Status& status) {
  chat_.OnFailure(index, status);
  failure_ = status;
  if (!chat_request_.stream) return "";
  Start();
  const json e = ErrorBody(status)["error"];
  Emit("error", {{"code", e["code"]}, {"message", e["message"]}, {"param", e["param"]}});
  return Flush();
}

std::string ResponsesBuilder::StreamEnd() {
  Start();
  if (failure_.has_value()) {
    Emit("response.failed",
         {{"response", ResponseObject("failed", finish_, output_, nullptr, nullptr)}});
    return Flush();
  }
  CloseReasoning();
  if (output_.empty()) OpenMessage();  // an empty answer is an empty message
  CloseMessage();
  const std::string status = StatusOf(finish_);
  final_ = ResponseObject(status, finish_, output_, UsageOf(chat_.Usage()), chat_.Stats(0));
  Emit(status == "completed" ? "response.completed" : "response.incomplete",
       {{"response", final_}});
  return Flush();
}

}  // namespace tinyserve::openai
