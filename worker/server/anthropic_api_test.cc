// Anthropic's Messages API (anthropic_api.h): a body's translation into a chat call and the
// errors naming Anthropic's fields; the message object and the stream events built from a
// worker's messages, text, stop sequences and tool calls.
#include "worker/server/anthropic_api.h"

#include <gtest/gtest.h>

#include <sstream>
#include <utility>
#include <vector>

#include "worker/server/openai_test_util.h"

namespace tinyserve::openai {
namespace {

using json = Json;
namespace v1 = tinyserve::v1;

const ServedModel kModel{"SmolLM2-135M-Instruct", 8192, {}, "", ""};
const ServedModel kHermes{"SmolLM2-135M-Instruct", 8192, {}, "hermes", ""};

ParsedRequest MustParse(const std::string& body, const ServedModel& model = kModel) {
  auto r = ParseMessagesRequest(body, model, "req");
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : ParsedRequest();
}

// The field a refused body names (its message starts with it), or "<ok>".
std::string FieldOf(const std::string& body) {
  auto r = ParseMessagesRequest(body, kModel, "req");
  if (r.ok()) return "<ok>";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  const json e = AnthropicErrorBody(r.status());
  EXPECT_EQ(e["type"], "error");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  const std::string message = e["error"]["message"];
  return message.substr(0, message.find(':'));
}

v1::GenerateResponse StoppedBy(const std::string& stop, int prompt, int completion) {
  v1::GenerateResponse r = Complete(v1::FINISH_REASON_STOP_STRING, prompt, completion);
  r.mutable_complete()->set_stop_string(stop);
  return r;
}

TEST(MessagesParse, BlocksBecomeChatMessages) {
  ParsedRequest r = MustParse(R"({
      "model": "m", "max_tokens": 64, "system": [{"type": "text", "text": "Be brief."}],
      "temperature": 0.5, "top_k": 5, "stop_sequences": ["END", "\n\n"],
      "metadata": {"user_id": "u"}, "thinking": {"type": "disabled"},
      "messages": [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": [
          {"type": "thinking", "thinking": "...", "signature": "s"},
          {"type": "text", "text": "Let me add."},
          {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 2, "b": 3}}]},
        {"role": "user", "content": [
          {"type": "tool_result", "tool_use_id": "toolu_1", "content": "5"},
          {"type": "text", "text": "And now?"}]}]})");
  EXPECT_EQ(r.endpoint, Endpoint::kMessages);
  ASSERT_EQ(r.calls.size(), 1u);
  const v1::GenerateRequest& c = r.calls[0];
  const v1::ChatMessages& chat = c.chat();
  ASSERT_EQ(chat.messages_size(), 5);
  EXPECT_EQ(chat.messages(0).role(), "system");
  EXPECT_EQ(chat.messages(0).content(), "Be brief.");
  EXPECT_EQ(chat.messages(1).role(), "user");
  EXPECT_EQ(chat.messages(2).role(), "assistant");
  EXPECT_EQ(chat.messages(2).content(), "Let me add.");
  EXPECT_EQ(chat.messages(2).reasoning_content(), "...");  // the thinking block
  const json calls = json::parse(chat.messages(2).tool_calls_json());
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["id"], "toolu_1");
  EXPECT_EQ(json::parse(calls[0]["function"]["arguments"].get<std::string>())["b"], 3);
  EXPECT_EQ(chat.messages(3).role(), "tool");
  EXPECT_EQ(chat.messages(3).tool_call_id(), "toolu_1");
  EXPECT_EQ(chat.messages(3).content(), "5");
  EXPECT_EQ(chat.messages(4).role(), "user");
  EXPECT_EQ(chat.messages(4).content(), "And now?");
  EXPECT_EQ(c.sampling().max_tokens(), 64);
  EXPECT_FLOAT_EQ(c.sampling().temperature(), 0.5f);
  EXPECT_EQ(c.sampling().top_k(), 5);
  ASSERT_EQ(c.sampling().stop_size(), 2);
  EXPECT_EQ(c.sampling().stop(1), "\n\n");
  EXPECT_EQ(r.model, "m");

  // Client tools; "any" forces a call among them, "tool" names one.
  const std::string tools = R"("tools": [{"name": "add", "description": "Adds", "input_schema":
      {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}])";
  ParsedRequest any = MustParse(R"({"max_tokens": 9, "messages": [{"role": "user", "content":
      "x"}], "tool_choice": {"type": "any"}, )" +
                                tools + "}");
  EXPECT_EQ(any.tool_choice, ParsedRequest::ToolChoice::kRequired);
  EXPECT_EQ(json::parse(any.calls[0].chat().tools_json())[0]["function"]["description"], "Adds");
  ParsedRequest named = MustParse(R"({"max_tokens": 9, "messages": [{"role": "user", "content":
      "x"}], "tool_choice": {"type": "tool", "name": "add"}, )" +
                                  tools + "}");
  EXPECT_EQ(named.tool_choice, ParsedRequest::ToolChoice::kNamed);
  // output_config.format: structured output (the client's messages.parse(output_format=...)).
  ParsedRequest schema = MustParse(R"({"max_tokens": 9, "messages": [{"role": "user", "content":
      "x"}], "output_config": {"format": {"type": "json_schema", "schema": {"type": "object",
      "properties": {"city": {"type": "string"}}, "required": ["city"]}}}})");
  EXPECT_EQ(schema.calls[0].sampling().response_format(), "json_schema");
  EXPECT_EQ(json::parse(schema.calls[0].sampling().json_schema())["required"][0], "city");
  EXPECT_EQ(MustParse(R"({"max_tokens": 9, "messages": [{"role": "user", "content": "x"}], )" +
                          tools + "}",
                      kHermes)
                .tool_choice,
            ParsedRequest::ToolChoice::kAuto);
}

TEST(MessagesParse, ErrorsNameAnthropicFields) {
  const std::string user = R"("messages": [{"role": "user", "content": "x"}])";
  EXPECT_EQ(FieldOf("{" + user + "}"), "max_tokens");
  // count_tokens bodies have none.
  auto counted = ParseMessagesRequest("{" + user + "}", kModel, "req", /*count_only=*/true);
  ASSERT_TRUE(counted.ok()) << counted.status();
  EXPECT_EQ(counted->calls[0].chat().messages(0).content(), "x");
  EXPECT_EQ(FieldOf(R"({"max_tokens": 0, )" + user + "}"), "max_tokens");
  EXPECT_EQ(FieldOf(R"({"max_tokens": 5})"), "messages");
  EXPECT_EQ(FieldOf(R"({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})"),
            "messages[0].role");
  EXPECT_EQ(FieldOf(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type":
                        "image", "source": {}}]}]})"),
            "messages[0].content[0].type");
  EXPECT_EQ(FieldOf(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type":
                        "tool_use", "id": "t", "name": "f", "input": {}}]}]})"),
            "messages[0].content[0].type");
  EXPECT_EQ(FieldOf(R"({"max_tokens": 5, "messages": [{"role": "assistant", "content": [{"type":
                        "tool_use", "id": "t", "name": "f", "input": 3}]}]})"),
            "messages[0].content[0].input");
  EXPECT_EQ(FieldOf(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type":
                        "tool_result", "content": "5"}]}]})"),
            "messages[0].content[0].tool_use_id");
  // A result answers a call of the assistant turn just before (Anthropic's API 400s too).
  EXPECT_EQ(FieldOf(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type":
                        "tool_result", "tool_use_id": "toolu_9", "content": "5"}]}]})"),
            "messages[0].content[0].tool_use_id");
  EXPECT_EQ(FieldOf(R"({"max_tokens": 5, "messages": [
                        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
                         "name": "f", "input": {}}]},
                        {"role": "user", "content": [{"type": "tool_result",
                         "tool_use_id": "toolu_2", "content": "5"}]}]})"),
            "messages[1].content[0].tool_use_id");
  EXPECT_EQ(FieldOf(R"({"max_tokens": 5, "system": 3, )" + user + "}"), "system");
  EXPECT_EQ(FieldOf(R"({"max_tokens": 5, "stop_sequences": "END", )" + user + "}"),
            "stop_sequences");
  EXPECT_EQ(FieldOf(R"({"max_tokens": 5, "thinking": {"type": "enabled", "budget_tokens": 1024},
                        )" +
                    user + "}"),
            "thinking");
  EXPECT_EQ(FieldOf(R"({"max_tokens": 5, "temperature": "hot", )" + user + "}"), "temperature");
  EXPECT_EQ(
      FieldOf(R"({"max_tokens": 5, "output_config": {"format": {"type": "xml"}}, )" + user + "}"),
      "output_config.format.type");
  EXPECT_EQ(FieldOf(R"({"max_tokens": 5, "output_config": {"format": {"type": "json_schema"}}, )" +
                    user + "}"),
            "output_config.format.schema");
  EXPECT_EQ(FieldOf(R"({"max_tokens": 5, "output_config": {"effort": "high"}, )" + user + "}"),
            "output_config.effort");
  EXPECT_EQ(FieldOf(R"({"max_tokens": 5, "tools": [{"type": "web_search_20250305", "name":
                        "web_search"}], )" +
                    user + "}"),
            "tools[0].type");
  EXPECT_EQ(FieldOf(R"({"max_tokens": 5, "tool_choice": {"type": "sometimes"}, )" + user + "}"),
            "tool_choice.type");
  // Errors the chat parser finds, renamed.
  EXPECT_EQ(FieldOf(R"({"max_tokens": 5, "tool_choice": {"type": "any"}, "tools": [{"name":
                        "bad name!"}], )" +
                    user + "}"),
            "tools[0].name");
  EXPECT_EQ(FieldOf(R"J({"max_tokens": 5, "tool_choice": {"type": "any"}, "tools": [{"name":
                        "f", "input_schema": {"type": "object", "properties": {"a": {"type":
                        "string", "pattern": "(?=x)"}}}}], )J" +
                    user + "}"),
            "tools[0].input_schema.properties.a.pattern");
  EXPECT_EQ(FieldOf(R"({"max_tokens": 5, "tool_choice": {"type": "tool", "name": "g"}, "tools":
                        [{"name": "f"}], )" +
                    user + "}"),
            "tool_choice.name");
  EXPECT_EQ(FieldOf(R"({"max_tokens": 5, "tools": [{"name": "f"}], )" + user + "}"),
            "tool_choice");  // "auto" needs --tool-call-parser, as in chat
  // Codes map to Anthropic's error types.
  EXPECT_EQ(AnthropicErrorBody(absl::ResourceExhaustedError("full"))["error"]["type"],
            "rate_limit_error");
  EXPECT_EQ(AnthropicErrorBody(absl::UnavailableError("draining"))["error"]["type"],
            "overloaded_error");
  EXPECT_EQ(AnthropicErrorBody(absl::NotFoundError("no model"))["error"]["type"],
            "not_found_error");
}

TEST(MessagesParse, ThinkingBudgetTokensIsTheThinkingBudget) {
  const ServedModel qwen3{"m", 8192, {}, "", "qwen3"};
  auto r = ParseMessagesRequest(R"({"max_tokens": 64, "messages": [{"role": "user", "content":
      "x"}], "thinking": {"type": "enabled", "budget_tokens": 16}})",
                                qwen3, "q");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->calls[0].sampling().thinking_token_budget(), 16);
  EXPECT_EQ(r->calls[0].sampling().reasoning_format(), "qwen3");
  auto bad = ParseMessagesRequest(R"({"max_tokens": 64, "messages": [{"role": "user", "content":
      "x"}], "thinking": {"type": "enabled", "budget_tokens": "many"}})",
                                  qwen3, "q");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(ErrorBody(bad.status())["error"]["param"], "thinking.budget_tokens");
}

TEST(MessagesBuild, BodyIsAMessageObject) {
  ParsedRequest r = MustParse(R"({"model": "m", "max_tokens": 20, "stop_sequences": ["END"],
      "messages": [{"role": "user", "content": "Hi"}]})");
  MessagesBuilder b(r, "msg_req");
  EXPECT_EQ(b.OnResponse(0, Chunk("Hel", 10, -0.5f)), "");
  EXPECT_EQ(b.OnResponse(0, Chunk("lo", 11, -1.5f)), "");
  EXPECT_EQ(b.OnResponse(0, StoppedBy("END", 6, 3)), "");
  const json body = json::parse(b.Body());
  EXPECT_EQ(body["id"], "msg_req");
  EXPECT_EQ(body["type"], "message");
  EXPECT_EQ(body["role"], "assistant");
  EXPECT_EQ(body["model"], "m");
  EXPECT_EQ(body["content"], json::parse(R"([{"type": "text", "text": "Hello"}])"));
  EXPECT_EQ(body["stop_reason"], "stop_sequence");
  EXPECT_EQ(body["stop_sequence"], "END");
  EXPECT_EQ(body["usage"], json::parse(R"({"input_tokens": 6, "cache_creation_input_tokens": 0,
      "cache_read_input_tokens": 3, "output_tokens": 3})"));
  EXPECT_EQ(body["tinyserve"]["worker"], "w1");
  for (const auto& [reason, want] : std::vector<std::pair<v1::FinishReason, std::string>>{
           {v1::FINISH_REASON_EOS, "end_turn"}, {v1::FINISH_REASON_LENGTH, "max_tokens"}}) {
    MessagesBuilder e(r, "msg_e");
    e.OnResponse(0, Chunk("Hi", 10, -0.5f));
    e.OnResponse(0, Complete(reason, 6, 1));
    const json eb = json::parse(e.Body());
    EXPECT_EQ(eb["stop_reason"], want);
    EXPECT_TRUE(eb["stop_sequence"].is_null());
  }
}

TEST(MessagesBuild, StreamSendsAnthropicEvents) {
  ParsedRequest r = MustParse(R"({"max_tokens": 20, "stream": true, "stop_sequences": ["END"],
      "messages": [{"role": "user", "content": "Hi"}]})");
  MessagesBuilder b(r, "msg_s");
  std::string sse = b.OnResponse(0, Chunk("Hel", 10, -0.5f));
  sse += b.OnResponse(0, Chunk("lo", 11, -1.5f));
  sse += b.OnResponse(0, StoppedBy("END", 6, 3));
  sse += b.StreamEnd();
  std::vector<std::string> types;
  std::string text;
  json delta;
  for (const auto& [type, data] : TypedEvents(sse)) {
    types.push_back(type);
    EXPECT_EQ(data["type"], type);
    if (type == "content_block_delta") {
      EXPECT_EQ(data["index"], 0);
      text += data["delta"]["text"].get<std::string>();
    }
    if (type == "message_delta") delta = data;
  }
  EXPECT_EQ(types,
            (std::vector<std::string>{"message_start", "content_block_start", "content_block_delta",
                                      "content_block_delta", "content_block_stop", "message_delta",
                                      "message_stop"}));
  EXPECT_EQ(text, "Hello");
  EXPECT_EQ(delta["delta"]["stop_reason"], "stop_sequence");
  EXPECT_EQ(delta["delta"]["stop_sequence"], "END");
  EXPECT_EQ(delta["usage"]["output_tokens"], 3);
  EXPECT_EQ(delta["usage"]["input_tokens"], 6);

  // A failure mid-stream is an error event, and nothing follows it.
  MessagesBuilder f(r, "msg_f");
  std::string failed = f.OnResponse(0, Chunk("Hel", 10, -0.5f));
  failed += f.OnFailure(0, grpc::Status(grpc::StatusCode::UNAVAILABLE, "draining"));
  failed += f.StreamEnd();
  const auto fe = TypedEvents(failed);
  EXPECT_EQ(fe.back().first, "error");
  EXPECT_EQ(fe.back().second["error"]["type"], "overloaded_error");
  EXPECT_EQ(fe.back().second["error"]["message"], "draining");
}

// With --reasoning-parser: "thinking": {"type": "enabled"} is accepted and the <think> block
// is a thinking block before the text, whole or streamed (thinking_delta events).
TEST(MessagesBuild, ReasoningIsAThinkingBlock) {
  const ServedModel qwen3{"m", 8192, {}, "", "qwen3"};
  const std::string ask =
      R"("max_tokens": 20, "thinking": {"type": "enabled", "budget_tokens": 1024},
      "messages": [{"role": "user", "content": "2+2?"}])";
  ParsedRequest r = MustParse("{" + ask + "}", qwen3);
  MessagesBuilder b(r, "msg_r");
  b.OnResponse(0, Chunk("<think>Add.</think>4", 10, -0.5f));
  b.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 6, 2));
  const json body = json::parse(b.Body());
  ASSERT_EQ(body["content"].size(), 2u);
  EXPECT_EQ(body["content"][0],
            json::parse(R"({"type": "thinking", "thinking": "Add.", "signature": ""})"));
  EXPECT_EQ(body["content"][1]["text"], "4");

  ParsedRequest s = MustParse(R"({"stream": true, )" + ask + "}", qwen3);
  MessagesBuilder sb(s, "msg_s");
  std::string sse = sb.OnResponse(0, Chunk("<think>Ad", 10, -0.5f));
  sse += sb.OnResponse(0, Chunk("d.</think>4", 11, -0.5f));
  sse += sb.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 6, 2));
  sse += sb.StreamEnd();
  std::string thought, text;
  std::vector<std::string> starts;
  for (const auto& [type, data] : TypedEvents(sse)) {
    if (type == "content_block_start") starts.push_back(data["content_block"]["type"]);
    if (type == "content_block_delta" && data["delta"]["type"] == "thinking_delta")
      thought += data["delta"]["thinking"].get<std::string>();
    if (type == "content_block_delta" && data["delta"]["type"] == "text_delta")
      text += data["delta"]["text"].get<std::string>();
  }
  EXPECT_EQ(starts, (std::vector<std::string>{"thinking", "text"}));
  EXPECT_EQ(thought, "Add.");
  EXPECT_EQ(text, "4");
}

TEST(MessagesBuild, ToolCallsAreToolUseBlocks) {
  const std::string tools = R"("tools": [{"name": "add", "input_schema": {"type": "object",
      "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}])";
  const std::string ask = R"("messages": [{"role": "user", "content": "Add 2 and 3"}])";
  ParsedRequest r = MustParse(R"({"max_tokens": 50, "tool_choice": {"type": "tool", "name":
      "add"}, )" + tools + ", " +
                              ask + "}");
  MessagesBuilder b(r, "msg_t");
  b.OnResponse(0, Chunk(R"({"a": 2, "b": 3})", 5, -0.1f));
  b.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 9, 8));
  const json body = json::parse(b.Body());
  ASSERT_EQ(body["content"].size(), 1u);
  const json& use = body["content"][0];
  EXPECT_EQ(use["type"], "tool_use");
  EXPECT_EQ(use["name"], "add");
  EXPECT_EQ(use["input"], json::parse(R"({"a": 2, "b": 3})"));
  EXPECT_EQ(use["id"].get<std::string>().rfind("toolu_", 0), 0u);
  EXPECT_EQ(body["stop_reason"], "tool_use");

  // Streamed: the block, its input as one input_json_delta, then the stop reason.
  ParsedRequest s = MustParse(R"({"max_tokens": 50, "stream": true, "tool_choice": {"type":
      "any"}, )" + tools + ", " +
                              ask + "}");
  MessagesBuilder sb(s, "msg_st");
  std::string sse = sb.OnResponse(
      0, Chunk(R"({"a": 2, "b": 3})", 5, -0.1f));  // one tool: the output is its input
  sse += sb.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 9, 8));
  sse += sb.StreamEnd();
  std::vector<std::string> types;
  std::string partial;
  json stop;
  for (const auto& [type, data] : TypedEvents(sse)) {
    types.push_back(type);
    if (type == "content_block_start") {
      EXPECT_EQ(data["content_block"]["type"], "tool_use");
    }
    if (type == "content_block_delta") partial += data["delta"]["partial_json"];
    if (type == "message_delta") stop = data["delta"]["stop_reason"];
  }
  EXPECT_EQ(types,
            (std::vector<std::string>{"message_start", "content_block_start", "content_block_delta",
                                      "content_block_stop", "message_delta", "message_stop"}));
  EXPECT_EQ(json::parse(partial)["b"], 3);
  EXPECT_EQ(stop, "tool_use");

  // "auto" (hermes): text, then the calls; disable_parallel_tool_use keeps the first.
  ParsedRequest a = MustParse(R"({"max_tokens": 99, "tool_choice": {"type": "auto",
      "disable_parallel_tool_use": true}, )" +
                                  tools + ", " + ask + "}",
                              kHermes);
  MessagesBuilder ab(a, "msg_a");
  ab.OnResponse(0, Chunk("Adding. <tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1, "
                         "\"b\": 2}}</tool_call><tool_call>{\"name\": \"add\", \"arguments\": "
                         "{\"a\": 3, \"b\": 4}}</tool_call>",
                         5, -0.1f));
  ab.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 9, 30));
  const json auto_body = json::parse(ab.Body());
  ASSERT_EQ(auto_body["content"].size(), 2u);
  EXPECT_EQ(auto_body["content"][0]["text"], "Adding. ");
  EXPECT_EQ(auto_body["content"][1]["input"]["a"], 1);
  EXPECT_EQ(auto_body["stop_reason"], "tool_use");
}

}  // namespace
}  // namespace tinyserve::openai
