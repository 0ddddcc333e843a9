// The Responses API (openai_responses.h): a body's translation into a chat call and the errors
// naming Responses fields; the response object and the typed stream events built from a
// worker's messages, text and function calls.
#include "worker/server/openai_responses.h"

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
  auto r = ParseResponsesRequest(body, model, "req");
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : ParsedRequest();
}

// The field a refused body's error names ("param"), or "<ok>".
std::string ParamOf(const std::string& body) {
  auto r = ParseResponsesRequest(body, kModel, "req");
  if (r.ok()) return "<ok>";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  const json e = ErrorBody(r.status());
  // The message starts with the field too.
  EXPECT_EQ(
      e["error"]["message"].get<std::string>().rfind(e["error"]["param"].get<std::string>(), 0), 0u)
      << e.dump();
  return e["error"]["param"];
}

TEST(ResponsesParse, InputItemsBecomeChatMessages) {
  ParsedRequest r = MustParse(R"({
      "model": "m", "instructions": "Be brief.", "max_output_tokens": 40, "temperature": 0.5,
      "top_p": 0.9, "seed": 3, "metadata": {"k": "v"}, "store": true,
      "include": ["message.output_text.logprobs", "reasoning.encrypted_content"],
      "top_logprobs": 2, "reasoning": {"effort": null}, "truncation": "disabled",
      "input": [
        {"role": "user", "content": "What is 2 + 3?"},
        {"type": "reasoning", "id": "rs_0", "summary": []},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "Add them."}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Let me add."}]},
        {"type": "function_call", "call_id": "call_1", "name": "add",
         "arguments": "{\"a\": 2, \"b\": 3}"},
        {"type": "function_call", "call_id": "call_2", "name": "add",
         "arguments": "{\"a\": 0, \"b\": 0}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "5"},
        {"type": "function_call_output", "call_id": "call_2",
         "output": [{"type": "input_text", "text": "0"}]},
        {"role": "developer", "content": [{"type": "input_text", "text": "Answer now."},
                                          {"type": "input_text", "text": "Thanks."}]}]})");
  EXPECT_EQ(r.endpoint, Endpoint::kResponses);
  ASSERT_EQ(r.calls.size(), 1u);
  const v1::GenerateRequest& c = r.calls[0];
  const v1::ChatMessages& chat = c.chat();
  ASSERT_EQ(chat.messages_size(), 6);
  EXPECT_EQ(chat.messages(0).role(), "system");
  EXPECT_EQ(chat.messages(0).content(), "Be brief.");
  EXPECT_EQ(chat.messages(1).role(), "user");
  EXPECT_EQ(chat.messages(2).role(), "assistant");
  EXPECT_EQ(chat.messages(2).content(), "Let me add.");
  // A reasoning item begins the assistant turn (an empty one is dropped); the message after it
  // is that turn's content, and both calls of the turn join it.
  EXPECT_EQ(chat.messages(2).reasoning_content(), "Add them.");
  const json calls = json::parse(chat.messages(2).tool_calls_json());
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]["id"], "call_1");
  EXPECT_EQ(calls[1]["function"]["arguments"], "{\"a\": 0, \"b\": 0}");
  EXPECT_EQ(chat.messages(3).role(), "tool");
  EXPECT_EQ(chat.messages(3).tool_call_id(), "call_1");
  EXPECT_EQ(chat.messages(4).content(), "0");
  EXPECT_EQ(chat.messages(5).role(), "system");  // developer, as chat reads it
  EXPECT_EQ(chat.messages(5).content(), "Answer now.\nThanks.");
  EXPECT_EQ(c.sampling().max_tokens(), 40);
  EXPECT_FLOAT_EQ(c.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(c.sampling().top_p(), 0.9f);
  EXPECT_EQ(c.sampling().seed(), 3u);
  EXPECT_EQ(c.sampling().logprobs(), 2);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.responses["instructions"], "Be brief.");
  EXPECT_EQ(r.responses["metadata"]["k"], "v");
  EXPECT_EQ(r.responses["store"], false);  // no store given: nothing is kept
  EXPECT_EQ(r.responses["top_logprobs"], 2);
  EXPECT_EQ(r.responses["text"]["format"]["type"], "text");
}

TEST(ResponsesParse, StringInputToolsAndTextFormat) {
  ParsedRequest plain = MustParse(R"({"input": "Hi", "stream": true})");
  ASSERT_EQ(plain.calls[0].chat().messages_size(), 1);
  EXPECT_EQ(plain.calls[0].chat().messages(0).role(), "user");
  EXPECT_EQ(plain.calls[0].chat().messages(0).content(), "Hi");
  EXPECT_EQ(plain.calls[0].sampling().max_tokens(), kModel.max_context);  // chat's default
  EXPECT_TRUE(plain.stream);
  EXPECT_FALSE(plain.logprobs);

  ParsedRequest schema = MustParse(R"({"input": "Hi", "text": {"format": {"type": "json_schema",
      "name": "pet", "strict": true, "schema": {"type": "object",
      "properties": {"name": {"type": "string"}}, "required": ["name"]}}}})");
  EXPECT_EQ(schema.calls[0].sampling().response_format(), "json_schema");
  EXPECT_EQ(json::parse(schema.calls[0].sampling().json_schema())["required"][0], "name");
  EXPECT_EQ(schema.responses["text"]["format"]["name"], "pet");
  EXPECT_EQ(MustParse(R"({"input": "Hi", "text": {"format": {"type": "json_object"}}})")
                .calls[0]
                .sampling()
                .response_format(),
            "json_object");

  // A flat function tool forced by name: chat's tool, the output held to its schema.
  ParsedRequest tools = MustParse(R"({"input": "Add 2 and 3", "tools": [{"type": "function",
      "name": "add", "description": "Adds", "parameters": {"type": "object", "properties":
      {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}],
      "tool_choice": {"type": "function", "name": "add"}})");
  EXPECT_EQ(tools.tool_choice, ParsedRequest::ToolChoice::kNamed);
  EXPECT_EQ(tools.tool_name, "add");
  EXPECT_EQ(json::parse(tools.calls[0].chat().tools_json())[0]["function"]["description"], "Adds");
  EXPECT_EQ(tools.calls[0].sampling().response_format(), "json_schema");
  EXPECT_EQ(tools.responses["tools"][0]["name"], "add");
  // "auto" with the server's tool-call parser.
  ParsedRequest automatic =
      MustParse(R"({"input": "x", "tools": [{"type": "function", "name": "add"}]})", kHermes);
  EXPECT_EQ(automatic.tool_choice, ParsedRequest::ToolChoice::kAuto);
}

TEST(ResponsesParse, ErrorsNameTheResponsesField) {
  EXPECT_EQ(ParamOf(R"({})"), "input");
  EXPECT_EQ(ParamOf(R"({"input": 5})"), "input");
  EXPECT_EQ(ParamOf(R"({"input": []})"), "input");
  EXPECT_EQ(ParamOf(R"({"input": ["hi"]})"), "input[0]");
  EXPECT_EQ(ParamOf(R"({"input": [{"role": "robot", "content": "x"}]})"), "input[0].role");
  EXPECT_EQ(ParamOf(R"({"input": [{"role": "user"}]})"), "input[0].content");
  EXPECT_EQ(ParamOf(R"({"input": [{"role": "user", "content": [{"type": "input_image",
                        "image_url": "https://x"}]}]})"),
            "input[0].content[0].type");
  EXPECT_EQ(ParamOf(R"({"input": [{"role": "user", "content": [{"type": "input_text"}]}]})"),
            "input[0].content[0].text");
  EXPECT_EQ(ParamOf(R"({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]})"),
            "input[0].call_id");
  EXPECT_EQ(ParamOf(R"({"input": [{"type": "function_call_output", "call_id": "c"}]})"),
            "input[0].output");
  EXPECT_EQ(ParamOf(R"({"input": [{"type": "item_reference", "id": "msg_1"}]})"), "input[0]");
  EXPECT_EQ(ParamOf(R"({"input": [{"type": "web_search_call", "id": "ws_1"}]})"), "input[0].type");
  EXPECT_EQ(ParamOf(R"({"input": "x", "instructions": 3})"), "instructions");
  EXPECT_EQ(ParamOf(R"({"input": "x", "max_output_tokens": 0})"), "max_output_tokens");
  EXPECT_EQ(ParamOf(R"({"input": "x", "temperature": "hot"})"), "temperature");
  EXPECT_EQ(ParamOf(R"({"input": "x", "previous_response_id": "resp_1"})"), "previous_response_id");
  EXPECT_EQ(ParamOf(R"({"input": "x", "conversation": "conv_1"})"), "conversation");
  EXPECT_EQ(ParamOf(R"({"input": "x", "background": true})"), "background");
  EXPECT_EQ(ParamOf(R"({"input": "x", "truncation": "auto"})"), "truncation");
  EXPECT_EQ(ParamOf(R"({"input": "x", "reasoning": {"effort": "extreme"}})"), "reasoning.effort");
  EXPECT_EQ(ParamOf(R"({"input": "x", "reasoning": "high"})"), "reasoning");
  EXPECT_EQ(ParamOf(R"({"input": "x", "metadata": {"k": 1}})"), "metadata");
  EXPECT_EQ(ParamOf(R"({"input": "x", "include": "all"})"), "include");
  EXPECT_EQ(ParamOf(R"({"input": "x", "text": {"format": {"type": "json_schema"}}})"),
            "text.format.schema");
  EXPECT_EQ(ParamOf(R"({"input": "x", "text": {"format": {"type": "xml"}}})"), "text.format.type");
  EXPECT_EQ(ParamOf(R"({"input": "x", "tools": [{"type": "web_search"}]})"), "tools[0].type");
  // Errors the chat parser finds are renamed to the Responses fields.
  const std::string add = R"([{"type": "function", "name": "add"}])";
  EXPECT_EQ(ParamOf(R"({"input": "x", "tool_choice": "required", "tools": [{"type": "function",
                        "name": "bad name!"}]})"),
            "tools[0].name");
  EXPECT_EQ(ParamOf(R"J({"input": "x", "tool_choice": "required", "tools": [{"type": "function",
                        "name": "f", "parameters": {"type": "object", "properties": {"a":
                        {"type": "string", "pattern": "(?=x)"}}}}]})J"),
            "tools[0].parameters.properties.a.pattern");
  EXPECT_EQ(ParamOf(R"({"input": "x", "tools": )" + add +
                    R"(, "tool_choice": {"type": "function", "name": "nope"}})"),
            "tool_choice.name");
  EXPECT_EQ(ParamOf(R"({"input": "x", "tools": )" + add + R"(, "tool_choice": {"type": "mcp"}})"),
            "tool_choice");
  // Without --tool-call-parser, "auto" (the default with tools) is refused as in chat.
  EXPECT_EQ(ParamOf(R"({"input": "x", "tools": )" + add + "}"), "tool_choice");
  EXPECT_EQ(ParamOf(R"({"input": "x", "top_logprobs": 21})"), "top_logprobs");
  // Neutral values of what is not implemented pass.
  EXPECT_EQ(ParamOf(R"({"input": "x", "store": true, "background": false, "truncation":
                        "disabled", "reasoning": {}, "previous_response_id": null,
                        "include": ["file_search_call.results"], "parallel_tool_calls": false,
                        "service_tier": "auto", "user": "u", "stream_options": {}})"),
            "<ok>");
}

TEST(ResponsesParse, ReasoningEffortIsATemplateVariable) {
  // As vLLM passes it: chat's reasoning_effort, the chat template's variable of that name.
  ParsedRequest r = MustParse(R"({"input": "x", "reasoning": {"effort": "low"}})");
  EXPECT_EQ(json::parse(r.calls[0].chat().template_kwargs_json())["reasoning_effort"], "low");
  EXPECT_EQ(r.responses["reasoning"]["effort"], "low");
  EXPECT_TRUE(MustParse(R"({"input": "x"})").calls[0].chat().template_kwargs_json().empty());
}

TEST(ResponsesBuild, BodyIsAResponseObject) {
  ParsedRequest r = MustParse(R"({"model": "m", "input": "Hi", "instructions": "Be brief.",
      "include": ["message.output_text.logprobs"], "metadata": {"k": "v"}})");
  ResponsesBuilder b(r, "resp_req", 123);
  EXPECT_EQ(b.OnResponse(0, Chunk("Hel", 10, -0.5f)), "");
  EXPECT_EQ(b.OnResponse(0, Chunk("lo", 11, -1.5f)), "");
  EXPECT_EQ(b.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 6, 2)), "");
  const json body = json::parse(b.Body());
  EXPECT_EQ(body["id"], "resp_req");
  EXPECT_EQ(body["object"], "response");
  EXPECT_EQ(body["created_at"], 123);
  EXPECT_EQ(body["status"], "completed");
  EXPECT_TRUE(body["incomplete_details"].is_null());
  EXPECT_TRUE(body["error"].is_null());
  EXPECT_EQ(body["model"], "m");
  EXPECT_EQ(body["instructions"], "Be brief.");
  EXPECT_EQ(body["metadata"]["k"], "v");
  ASSERT_EQ(body["output"].size(), 1u);
  const json& item = body["output"][0];
  EXPECT_EQ(item["type"], "message");
  EXPECT_EQ(item["id"], "msg_req");
  EXPECT_EQ(item["role"], "assistant");
  EXPECT_EQ(item["status"], "completed");
  EXPECT_EQ(item["content"][0]["type"], "output_text");
  EXPECT_EQ(item["content"][0]["text"], "Hello");
  ASSERT_EQ(item["content"][0]["logprobs"].size(), 2u);
  EXPECT_FLOAT_EQ(item["content"][0]["logprobs"][1]["logprob"].get<float>(), -1.5f);
  EXPECT_EQ(item["content"][0]["logprobs"][1]["token"], "lo");
  EXPECT_EQ(body["usage"], json::parse(R"({"input_tokens": 6, "input_tokens_details":
      {"cached_tokens": 3}, "output_tokens": 2, "output_tokens_details": {"reasoning_tokens": 0},
      "total_tokens": 8})"));
  EXPECT_EQ(body["tinyserve"]["worker"], "w1");

  // Cut by max_output_tokens: incomplete, and says why.
  ParsedRequest cut = MustParse(R"({"input": "Hi", "max_output_tokens": 1})");
  ResponsesBuilder c(cut, "resp_c", 1);
  c.OnResponse(0, Chunk("Hel", 10, -0.5f));
  c.OnResponse(0, Complete(v1::FINISH_REASON_LENGTH, 6, 1));
  const json cb = json::parse(c.Body());
  EXPECT_EQ(cb["status"], "incomplete");
  EXPECT_EQ(cb["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(cb["output"][0]["status"], "incomplete");
  EXPECT_EQ(cb["output"][0]["content"][0]["logprobs"], json::array());  // not asked for
  EXPECT_EQ(cb["max_output_tokens"], 1);
}

TEST(ResponsesBuild, StreamSendsTypedEventsInOrder) {
  ParsedRequest r = MustParse(R"({"input": "Hi", "stream": true})");
  ResponsesBuilder b(r, "resp_s", 9);
  std::string sse = b.OnResponse(0, Chunk("Hel", 10, -0.5f));
  sse += b.OnResponse(0, Chunk("lo", 11, -1.5f));
  sse += b.OnResponse(0, Complete(v1::FINISH_REASON_STOP_STRING, 6, 2));
  sse += b.StreamEnd();
  EXPECT_EQ(sse.find("[DONE]"), std::string::npos);
  const auto events = TypedEvents(sse);
  std::vector<std::string> types;
  std::string text;
  for (size_t i = 0; i < events.size(); ++i) {
    const auto& [type, data] = events[i];
    types.push_back(type);
    EXPECT_EQ(data["type"], type);
    EXPECT_EQ(data["sequence_number"], i);
    if (type == "response.output_text.delta") {
      EXPECT_EQ(data["item_id"], "msg_s");
      EXPECT_EQ(data["output_index"], 0);
      text += data["delta"].get<std::string>();
    }
  }
  EXPECT_EQ(types,
            (std::vector<std::string>{"response.created", "response.in_progress",
                                      "response.output_item.added", "response.content_part.added",
                                      "response.output_text.delta", "response.output_text.delta",
                                      "response.output_text.done", "response.content_part.done",
                                      "response.output_item.done", "response.completed"}));
  EXPECT_EQ(text, "Hello");
  EXPECT_EQ(events[0].second["response"]["status"], "in_progress");
  EXPECT_EQ(events[2].second["item"]["content"], json::array());
  EXPECT_EQ(events[6].second["text"], "Hello");
  const json& done = events.back().second["response"];
  EXPECT_EQ(done["status"], "completed");
  EXPECT_EQ(done["output"][0]["content"][0]["text"], "Hello");
  EXPECT_EQ(done["usage"]["output_tokens"], 2);
  EXPECT_EQ(done["tinyserve"]["worker"], "w1");

  // An empty answer is still a message; max_output_tokens ends it incomplete.
  ResponsesBuilder e(r, "resp_e", 9);
  std::string empty_sse = e.OnResponse(0, Complete(v1::FINISH_REASON_LENGTH, 6, 0));
  empty_sse += e.StreamEnd();
  const auto empty = TypedEvents(empty_sse);
  EXPECT_EQ(empty.back().first, "response.incomplete");
  EXPECT_EQ(empty.back().second["response"]["output"][0]["content"][0]["text"], "");
  EXPECT_EQ(empty.back().second["response"]["incomplete_details"]["reason"], "max_output_tokens");

  // A failure mid-stream: an error event, then response.failed.
  ResponsesBuilder f(r, "resp_f", 9);
  std::string failed = f.OnResponse(0, Chunk("Hel", 10, -0.5f));
  failed += f.OnFailure(0, grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "no KV pages"));
  failed += f.StreamEnd();
  const auto fe = TypedEvents(failed);
  ASSERT_GE(fe.size(), 3u);
  EXPECT_EQ(fe[fe.size() - 2].first, "error");
  EXPECT_EQ(fe[fe.size() - 2].second["message"], "no KV pages");
  EXPECT_EQ(fe.back().first, "response.failed");
  EXPECT_EQ(fe.back().second["response"]["status"], "failed");
  EXPECT_EQ(fe.back().second["response"]["error"]["message"], "no KV pages");
}

// With --reasoning-parser the <think> block is a reasoning item before the message, whole
// or streamed (output_item.added, reasoning_text.delta..., reasoning_text.done, output_item.done).
TEST(ResponsesBuild, ReasoningIsAReasoningItem) {
  const ServedModel qwen3{"m", 8192, {}, "", "qwen3"};
  ParsedRequest r = MustParse(R"({"input": "2+2?"})", qwen3);
  ResponsesBuilder b(r, "resp_r", 9);
  b.OnResponse(0, Chunk("<think>Add.</think>", 10, -0.5f));
  b.OnResponse(0, Chunk("4", 11, -0.5f));
  b.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 6, 2));
  json body = json::parse(b.Body());
  ASSERT_EQ(body["output"].size(), 2u);
  EXPECT_EQ(body["output"][0]["type"], "reasoning");
  EXPECT_EQ(body["output"][0]["id"], "rs_r");
  EXPECT_EQ(body["output"][0]["content"][0],
            json::parse(R"({"type": "reasoning_text", "text": "Add."})"));
  EXPECT_EQ(body["output"][1]["content"][0]["text"], "4");

  ParsedRequest s = MustParse(R"({"input": "2+2?", "stream": true})", qwen3);
  ResponsesBuilder sb(s, "resp_t", 9);
  std::string sse = sb.OnResponse(0, Chunk("<think>Ad", 10, -0.5f));
  sse += sb.OnResponse(0, Chunk("d.</think>4", 11, -0.5f));
  sse += sb.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 6, 2));
  sse += sb.StreamEnd();
  std::vector<std::string> types;
  std::string thought;
  const auto events = TypedEvents(sse);
  for (size_t i = 0; i < events.size(); ++i) {
    const auto& [type, data] = events[i];
    types.push_back(type);
    EXPECT_EQ(data["sequence_number"], i);
    if (type == "response.reasoning_text.delta") thought += data["delta"].get<std::string>();
  }
  EXPECT_EQ(thought, "Add.");
  EXPECT_EQ(
      types,
      (std::vector<std::string>{
          "response.created", "response.in_progress", "response.output_item.added",
          "response.reasoning_text.delta", "response.reasoning_text.delta",
          "response.reasoning_text.done", "response.output_item.done", "response.output_item.added",
          "response.content_part.added", "response.output_text.delta", "response.output_text.done",
          "response.content_part.done", "response.output_item.done", "response.completed"}));
  const json& done = events.back().second["response"];
  EXPECT_EQ(done["output"][0]["type"], "reasoning");
  EXPECT_EQ(done["output"][1]["type"], "message");
  EXPECT_EQ(done["output"][1]["content"][0]["text"], "4");
}

TEST(ResponsesBuild, ToolCallsAreFunctionCallItems) {
  const std::string tools = R"("tools": [{"type": "function", "name": "add", "parameters":
      {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "required": ["a", "b"]}}])";
  ParsedRequest r = MustParse(R"({"input": "Add 2 and 3", )" + tools +
                              R"(, "tool_choice": {"type": "function", "name": "add"}})");
  ResponsesBuilder b(r, "resp_t", 1);
  b.OnResponse(0, Chunk(R"({"a": 2, "b": 3})", 5, -0.1f));
  b.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 9, 8));
  const json body = json::parse(b.Body());
  ASSERT_EQ(body["output"].size(), 1u);
  const json& call = body["output"][0];
  EXPECT_EQ(call["type"], "function_call");
  EXPECT_EQ(call["name"], "add");
  EXPECT_EQ(json::parse(call["arguments"].get<std::string>()), json::parse(R"({"a": 2, "b": 3})"));
  EXPECT_EQ(call["call_id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(call["id"].get<std::string>().rfind("fc_", 0), 0u);
  EXPECT_EQ(call["status"], "completed");
  EXPECT_EQ(body["status"], "completed");
  EXPECT_EQ(body["tool_choice"]["name"], "add");

  // Streamed: the item, its arguments whole, then the response.
  ParsedRequest s = MustParse(R"({"input": "Add 2 and 3", "stream": true, )" + tools +
                              R"(, "tool_choice": "required"})");
  ResponsesBuilder sb(s, "resp_st", 1);
  std::string sse = sb.OnResponse(0, Chunk(R"({"a": 2, "b": 3})", 5, -0.1f));
  sse += sb.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 9, 8));
  sse += sb.StreamEnd();
  std::vector<std::string> types;
  std::string arguments;
  json final_response;
  for (const auto& [type, data] : TypedEvents(sse)) {
    types.push_back(type);
    if (type == "response.function_call_arguments.delta") arguments += data["delta"];
    if (type == "response.output_item.added") {
      EXPECT_EQ(data["item"]["type"], "function_call");
    }
    if (type == "response.completed") final_response = data["response"];
  }
  EXPECT_EQ(types,
            (std::vector<std::string>{
                "response.created", "response.in_progress", "response.output_item.added",
                "response.function_call_arguments.delta", "response.function_call_arguments.done",
                "response.output_item.done", "response.completed"}));
  EXPECT_EQ(json::parse(arguments)["b"], 3);
  ASSERT_EQ(final_response["output"].size(), 1u);
  EXPECT_EQ(final_response["output"][0]["name"], "add");

  // "auto" with the hermes parser: text before the calls is a message item; with
  // parallel_tool_calls false only the first call is answered.
  ParsedRequest a =
      MustParse(R"({"input": "x", "parallel_tool_calls": false, )" + tools + "}", kHermes);
  ResponsesBuilder ab(a, "resp_a", 1);
  ab.OnResponse(0, Chunk("Adding. <tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1, "
                         "\"b\": 2}}</tool_call><tool_call>{\"name\": \"add\", \"arguments\": "
                         "{\"a\": 3, \"b\": 4}}</tool_call>",
                         5, -0.1f));
  ab.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 9, 30));
  const json auto_body = json::parse(ab.Body());
  ASSERT_EQ(auto_body["output"].size(), 2u);
  EXPECT_EQ(auto_body["output"][0]["content"][0]["text"], "Adding. ");
  EXPECT_EQ(json::parse(auto_body["output"][1]["arguments"].get<std::string>())["a"], 1);
  EXPECT_EQ(auto_body["parallel_tool_calls"], false);
}

}  // namespace
}  // namespace tinyserve::openai
