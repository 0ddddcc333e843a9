#include "worker/server/openai_api.h"

#include <gtest/gtest.h>

#include <sstream>

#include "absl/strings/str_cat.h"
#include "worker/sampling/json_schema.h"
#include "worker/server/openai_test_util.h"

namespace tinyserve::openai {
namespace {

using json = nlohmann::ordered_json;
namespace v1 = tinyserve::v1;

const ServedModel kModel{"SmolLM2-135M-Instruct", 8192, {}, "", ""};

ParsedRequest MustParse(Endpoint endpoint, const std::string& body) {
  auto r = ParseRequest(endpoint, body, kModel, "req");
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : ParsedRequest();
}

// The field an INVALID_ARGUMENT names (its "param").
std::string ParamOf(Endpoint endpoint, const std::string& body) {
  auto r = ParseRequest(endpoint, body, kModel, "req");
  if (r.ok()) return "<ok>";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  json e = ErrorBody(r.status());
  return e["error"]["param"].is_null() ? "<none>" : e["error"]["param"].get<std::string>();
}

TEST(OpenAiParse, CompletionsDefaultsFollowOpenAi) {
  ParsedRequest r = MustParse(Endpoint::kCompletions, R"({"model": "x", "prompt": "Hi"})");
  ASSERT_EQ(r.calls.size(), 1u);
  const v1::GenerateRequest& c = r.calls[0];
  EXPECT_EQ(c.text(), "Hi");
  EXPECT_EQ(c.request_id(), "req");
  EXPECT_FLOAT_EQ(c.sampling().temperature(), 1.0f);
  EXPECT_EQ(c.sampling().max_tokens(), 16);
  EXPECT_FALSE(c.sampling().has_logprobs());
  EXPECT_EQ(r.model, "x");
  EXPECT_FALSE(r.stream);
}

TEST(OpenAiParse, ModelNamesALoraAdapter) {
  const ServedModel with_loras{"base", 8192, {"sql", "chat"}, "", ""};
  auto parse = [&](const std::string& body) {
    return ParseRequest(Endpoint::kChat, body, with_loras, "req");
  };
  const std::string messages = R"("messages": [{"role": "user", "content": "Hi"}])";
  auto r = parse(R"({"model": "sql", "n": 2, )" + messages + "}");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->calls.size(), 2u);
  for (const auto& c : r->calls) EXPECT_EQ(c.lora_adapter(), "sql");
  EXPECT_EQ(r->model, "sql");
  for (const char* base : {R"({"model": "base", )", "{"}) {
    r = parse(std::string(base) + messages + "}");
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->calls[0].lora_adapter(), "");
  }
  r = parse(R"({"model": "nope", )" + messages + "}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  const json e = ErrorBody(r.status());
  EXPECT_EQ(e["error"]["param"], "model");
  EXPECT_EQ(e["error"]["type"], "not_found_error");
  // Without adapters, any name is the one model.
  auto plain =
      ParseRequest(Endpoint::kChat, R"({"model": "nope", )" + messages + "}", kModel, "req");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->calls[0].lora_adapter(), "");
}

TEST(OpenAiParse, SamplingStopAndSelectionFields) {
  ParsedRequest r = MustParse(Endpoint::kCompletions, R"({
      "prompt": [1, 2, 3], "max_tokens": 5, "temperature": 0, "top_p": 0.5, "top_k": -1,
      "min_p": 0.1, "repetition_penalty": 1.2, "presence_penalty": 0.5,
      "frequency_penalty": -0.25, "seed": 7, "stop": "END", "stop_token_ids": [2],
      "ignore_eos": true, "logprobs": 3, "user": "someone", "logit_bias": {"5": -100, "7": 2.5},
      "min_tokens": 2, "cache_salt": "tenant-a", "priority": -3,
      "selection": {"policy": "quest", "budget": 512, "dense_layers": 1, "params": {"gqa": "max"}}
  })");
  ASSERT_EQ(r.calls.size(), 1u);
  const v1::GenerateRequest& c = r.calls[0];
  EXPECT_EQ(std::vector<int>(c.token_ids().ids().begin(), c.token_ids().ids().end()),
            (std::vector<int>{1, 2, 3}));
  const v1::SamplingOptions& s = c.sampling();
  EXPECT_EQ(s.max_tokens(), 5);
  EXPECT_FLOAT_EQ(s.temperature(), 0);
  EXPECT_FLOAT_EQ(s.top_p(), 0.5f);
  EXPECT_EQ(s.top_k(), 0);
  // top_p 0 keeps only the most likely token (it is not the proto's "unset").
  const float top_p0 = MustParse(Endpoint::kCompletions, R"({"prompt": "x", "top_p": 0})")
                           .calls[0]
                           .sampling()
                           .top_p();
  EXPECT_GT(top_p0, 0.0f);
  EXPECT_LT(top_p0, 1e-30f);
  EXPECT_FLOAT_EQ(s.min_p(), 0.1f);
  EXPECT_FLOAT_EQ(s.repetition_penalty(), 1.2f);
  EXPECT_FLOAT_EQ(s.presence_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(s.frequency_penalty(), -0.25f);
  EXPECT_EQ(s.seed(), 7u);
  ASSERT_EQ(s.stop_size(), 1);
  EXPECT_EQ(s.stop(0), "END");
  EXPECT_EQ(s.stop_token_ids(0), 2);
  EXPECT_TRUE(s.ignore_eos());
  EXPECT_EQ(s.logprobs(), 3);
  EXPECT_EQ(s.min_tokens(), 2);
  EXPECT_FLOAT_EQ(s.logit_bias().at(5), -100.0f);
  EXPECT_FLOAT_EQ(s.logit_bias().at(7), 2.5f);
  EXPECT_EQ(c.cache_salt(), "tenant-a");
  EXPECT_EQ(c.priority(), -3);
  ParsedRequest json_mode = MustParse(Endpoint::kChat, R"({"messages": [{"role": "user",
      "content": "x"}], "response_format": {"type": "json_object"}})");
  EXPECT_EQ(json_mode.calls[0].sampling().response_format(), "json_object");
  // A schema passes through with its properties in the order written (the output's order).
  ParsedRequest schema = MustParse(Endpoint::kChat, R"({"messages": [{"role": "user",
      "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"name": "p",
      "strict": true, "schema": {"type": "object", "properties": {"zeta": {"type": "string"},
      "alpha": {"type": "integer"}}}}}})");
  EXPECT_EQ(schema.calls[0].sampling().response_format(), "json_schema");
  const std::string& text = schema.calls[0].sampling().json_schema();
  EXPECT_LT(text.find("zeta"), text.find("alpha")) << text;
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(c.selection().policy(), "quest");
  EXPECT_EQ(c.selection().budget(), 512);
  EXPECT_EQ(c.selection().dense_layers(), 1);
  EXPECT_EQ(c.selection().params().at("gqa"), "max");
}

TEST(OpenAiParse, ThinkingTokenBudgetAndStructuredAnswersOfReasoningModels) {
  const ServedModel r1{"m", 8192, {}, "", "deepseek_r1"};
  const std::string ask = R"("messages": [{"role": "user", "content": "x"}])";
  auto r = ParseRequest(Endpoint::kChat, "{" + ask + R"(, "thinking_token_budget": 64})", r1, "q");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->calls[0].sampling().thinking_token_budget(), 64);
  EXPECT_EQ(r->calls[0].sampling().reasoning_format(), "deepseek_r1");
  EXPECT_FALSE(
      MustParse(Endpoint::kChat, "{" + ask + "}").calls[0].sampling().has_thinking_token_budget());
  // Constrained decoding holds the answer after the block: the format goes along, with or
  // without a budget; a forced tool call is held from the first token.
  auto json_mode = ParseRequest(
      Endpoint::kChat, "{" + ask + R"(, "response_format": {"type": "json_object"}})", r1, "q");
  ASSERT_TRUE(json_mode.ok()) << json_mode.status();
  EXPECT_EQ(json_mode->calls[0].sampling().reasoning_format(), "deepseek_r1");
  EXPECT_FALSE(json_mode->calls[0].sampling().has_thinking_token_budget());
  const std::string tool = R"("tools": [{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object"}}}], "tool_choice": "required")";
  auto called = ParseRequest(Endpoint::kChat, "{" + ask + ", " + tool + "}", r1, "q");
  ASSERT_TRUE(called.ok()) << called.status();
  EXPECT_EQ(called->calls[0].sampling().reasoning_format(), "");
  EXPECT_EQ(MustParse(Endpoint::kChat, "{" + ask + R"(, "guided_regex": "a+"})")
                .calls[0]
                .sampling()
                .reasoning_format(),
            "");  // no parser, no block
  // Without --reasoning-parser, negative, with a forced call: 400s naming the field.
  EXPECT_EQ(ParamOf(Endpoint::kChat, "{" + ask + R"(, "thinking_token_budget": 8})"),
            "thinking_token_budget");
  for (const std::string& extra :
       {std::string(R"("thinking_token_budget": -1)"), R"("thinking_token_budget": 8, )" + tool}) {
    auto bad = ParseRequest(Endpoint::kChat, "{" + ask + ", " + extra + "}", r1, "q");
    ASSERT_FALSE(bad.ok()) << extra;
    EXPECT_EQ(ErrorBody(bad.status())["error"]["param"], "thinking_token_budget") << extra;
  }
}

TEST(OpenAiParse, ReasoningEffortIsATemplateVariable) {
  const std::string ask = R"("messages": [{"role": "user", "content": "x"}])";
  auto kwargs = [&](const std::string& extra) {
    return json::parse(MustParse(Endpoint::kChat, "{" + ask + ", " + extra + "}")
                           .calls[0]
                           .chat()
                           .template_kwargs_json());
  };
  EXPECT_EQ(kwargs(R"("reasoning_effort": "high")"),
            json::parse(R"({"reasoning_effort": "high"})"));
  // chat_template_kwargs keeps its own, and its other variables.
  EXPECT_EQ(kwargs(R"("reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort":
                      "medium", "enable_thinking": true})"),
            json::parse(R"({"reasoning_effort": "medium", "enable_thinking": true})"));
  EXPECT_EQ(ParamOf(Endpoint::kChat, "{" + ask + R"(, "reasoning_effort": "max"})"),
            "reasoning_effort");
  EXPECT_EQ(ParamOf(Endpoint::kChat, "{" + ask + R"(, "reasoning_effort": 3})"),
            "reasoning_effort");
}

TEST(OpenAiParse, StructuredOutputsAsVllmTakesThem) {
  const Endpoint kC = Endpoint::kCompletions;
  auto sampling = [&](const std::string& extra) {
    return MustParse(kC, R"({"prompt": "x", )" + extra + "}").calls[0].sampling();
  };
  EXPECT_EQ(sampling(R"("guided_regex": "\\d{3}")").regex(), "\\d{3}");
  EXPECT_EQ(sampling(R"("guided_regex": "\\d{3}")").response_format(), "regex");
  EXPECT_EQ(sampling(R"("structured_outputs": {"regex": "a|b"})").regex(), "a|b");
  EXPECT_EQ(sampling(R"("guided_choice": ["yes", "no [maybe]"])").regex(),
            "(?:yes)|(?:no \\[maybe\\])");
  EXPECT_EQ(sampling(R"("structured_outputs": {"choice": ["a.b"]})").regex(), "(?:a\\.b)");
  const v1::SamplingOptions j = sampling(R"("guided_json": {"type": "object"})");
  EXPECT_EQ(j.response_format(), "json_schema");
  EXPECT_EQ(j.json_schema(), R"({"type":"object"})");
  EXPECT_EQ(sampling(R"("structured_outputs": {"json": "{\"type\": \"integer\"}"})").json_schema(),
            R"({"type":"integer"})");
  EXPECT_EQ(sampling(R"("structured_outputs": {"json_object": true})").response_format(),
            "json_object");
  EXPECT_EQ(sampling(R"("structured_outputs": {"regex": null, "choice": ["z"]})").regex(), "(?:z)");
  // GBNF: vLLM's two spellings, llama.cpp server's "grammar" and SGLang's "ebnf".
  for (const char* field : {R"("guided_grammar": )", R"("grammar": )", R"("ebnf": )"}) {
    const v1::SamplingOptions g = sampling(std::string(field) + R"("root ::= [0-9]+")");
    EXPECT_EQ(g.response_format(), "grammar");
    EXPECT_EQ(g.grammar(), "root ::= [0-9]+");
  }
  EXPECT_EQ(sampling(R"("structured_outputs": {"grammar": "root ::= \"a\""})").grammar(),
            "root ::= \"a\"");
  // Errors name the field.
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "grammar": "root ::= root \"a\""})"), "grammar");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "grammar": 7})"), "grammar");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "grammar": "root ::= \"a\"", "guided_regex": "a"})"),
            "grammar");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "guided_regex": "(a"})"), "guided_regex");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "guided_regex": ""})"), "guided_regex");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "structured_outputs": {"regex": "a{2,1}"}})"),
            "structured_outputs.regex");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "guided_choice": []})"), "guided_choice");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "guided_choice": ["a", 1]})"), "guided_choice");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "guided_json": "{nope"})"), "guided_json");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "structured_outputs": {"grammar": "root ::= x"}})"),
            "structured_outputs.grammar");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "guided_grammar": "root ::= x"})"), "guided_grammar");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "structured_outputs": "regex"})"), "structured_outputs");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "guided_regex": "a", "guided_choice": ["a"]})"),
            "guided_choice");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "response_format": {"type": "json_object"},
                "guided_regex": "a"})"),
            "guided_regex");
}

TEST(OpenAiParse, TextPromptsRecogniseSpecialTokens) {
  ParsedRequest r = MustParse(Endpoint::kCompletions, R"({"prompt": ["<|im_start|>x", [1, 2]]})");
  EXPECT_TRUE(r.calls[0].parse_special_tokens());
  EXPECT_EQ(r.calls[1].token_ids().ids_size(), 2);
}

TEST(OpenAiParse, ContinueFinalMessage) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "Capital of France?"},
      {"role": "assistant", "content": "The capital is"}])";
  ParsedRequest r = MustParse(Endpoint::kChat, "{" + msgs + R"(, "continue_final_message": true})");
  EXPECT_TRUE(r.calls[0].chat().continue_final_message());
  EXPECT_FALSE(r.calls[0].chat().has_add_generation_prompt());  // the worker's default: false
  ParsedRequest plain = MustParse(Endpoint::kChat, "{" + msgs + "}");
  EXPECT_FALSE(plain.calls[0].chat().continue_final_message());
  ParsedRequest no_header =
      MustParse(Endpoint::kChat, "{" + msgs + R"(, "add_generation_prompt": false})");
  EXPECT_FALSE(no_header.calls[0].chat().add_generation_prompt());
  EXPECT_TRUE(no_header.calls[0].chat().has_add_generation_prompt());
  EXPECT_EQ(ParamOf(Endpoint::kChat, "{" + msgs + R"(, "continue_final_message": true,
                    "add_generation_prompt": true})"),
            "continue_final_message");
  EXPECT_EQ(ParamOf(Endpoint::kChat, "{" + msgs + R"(, "continue_final_message": 1})"),
            "continue_final_message");
}

// vLLM's chat_template_kwargs reach the worker as a JSON object; the worker checks the keys
// (chat_template_test: TemplateKwargs).
TEST(OpenAiParse, ChatTemplateKwargs) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "Hi"}])";
  ParsedRequest r = MustParse(
      Endpoint::kChat, "{" + msgs + R"(, "chat_template_kwargs": {"enable_thinking": false}})");
  EXPECT_EQ(r.calls[0].chat().template_kwargs_json(), R"({"enable_thinking":false})");
  EXPECT_EQ(MustParse(Endpoint::kChat, "{" + msgs + "}").calls[0].chat().template_kwargs_json(),
            "");
  EXPECT_EQ(ParamOf(Endpoint::kChat, "{" + msgs + R"(, "chat_template_kwargs": "x"})"),
            "chat_template_kwargs");
  // An assistant turn's reasoning (vLLM's reasoning_content, or reasoning) goes to the template.
  ParsedRequest t = MustParse(Endpoint::kChat, R"({"messages": [{"role": "user", "content": "a"},
      {"role": "assistant", "content": "b", "reasoning_content": "why"},
      {"role": "assistant", "content": "c", "reasoning": "how"}]})");
  EXPECT_EQ(t.calls[0].chat().messages(1).reasoning_content(), "why");
  EXPECT_EQ(t.calls[0].chat().messages(2).reasoning_content(), "how");
  EXPECT_EQ(
      ParamOf(Endpoint::kChat,
              R"({"messages": [{"role": "user", "content": "a", "reasoning_content": "x"}]})"),
      "messages[0].reasoning_content");
}

TEST(OpenAiParse, PromptsTimesNBecomeSeparateSeededCalls) {
  ParsedRequest r = MustParse(Endpoint::kCompletions,
                              R"({"prompt": ["a", [5, 6]], "n": 2, "seed": 10, "echo": false})");
  ASSERT_EQ(r.calls.size(), 4u);
  EXPECT_EQ(r.calls[0].text(), "a");
  EXPECT_EQ(r.calls[1].text(), "a");
  EXPECT_EQ(r.calls[2].token_ids().ids_size(), 2);
  EXPECT_EQ(r.calls[3].request_id(), "req-3");
  EXPECT_EQ(r.calls[0].sampling().seed(), 10u);
  EXPECT_EQ(r.calls[1].sampling().seed(), 11u);
  EXPECT_EQ(r.calls[2].sampling().seed(), 10u);
}

TEST(OpenAiParse, ChatMessagesPartsRolesAndDefaults) {
  ParsedRequest r = MustParse(Endpoint::kChat, R"({
      "messages": [{"role": "developer", "content": "Be brief."},
                   {"role": "user", "content": [{"type": "text", "text": "Hello"},
                                                {"type": "text", "text": "there"}]},
                   {"role": "assistant", "content": "Hi."},
                   {"role": "user", "content": "Again", "name": "bob"}],
      "logprobs": true, "top_logprobs": 2, "stream": true,
      "stream_options": {"include_usage": true}, "tools": [], "tool_choice": "none",
      "response_format": {"type": "text"}})");
  ASSERT_EQ(r.calls.size(), 1u);
  const v1::ChatMessages& m = r.calls[0].chat();
  ASSERT_EQ(m.messages_size(), 4);
  EXPECT_EQ(m.messages(0).role(), "system");
  EXPECT_EQ(m.messages(1).content(), "Hello\nthere");
  EXPECT_EQ(m.messages(3).content(), "Again");
  // Chat runs to the end of the context by default; the engine stops there.
  EXPECT_EQ(r.calls[0].sampling().max_tokens(), kModel.max_context);
  EXPECT_EQ(r.calls[0].sampling().logprobs(), 2);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  ParsedRequest capped =
      MustParse(Endpoint::kChat,
                R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 9})");
  EXPECT_EQ(capped.calls[0].sampling().max_tokens(), 9);
}

// OpenAI's error types by HTTP status: a client's 4xx is never a "server_error".
TEST(OpenAiErrors, TypesFollowTheStatus) {
  auto type = [](absl::Status s) { return ErrorBody(s)["error"]["type"].get<std::string>(); };
  EXPECT_EQ(type(absl::InvalidArgumentError("x")), "invalid_request_error");
  EXPECT_EQ(type(absl::AlreadyExistsError("request_id in use")), "invalid_request_error");  // 409
  EXPECT_EQ(type(absl::NotFoundError("x")), "not_found_error");
  EXPECT_EQ(type(absl::ResourceExhaustedError("x")), "rate_limit_error");
  EXPECT_EQ(type(absl::UnavailableError("x")), "service_unavailable_error");
  EXPECT_EQ(type(absl::InternalError("x")), "server_error");
}

TEST(OpenAiParse, BadInputNamesTheField) {
  const Endpoint kC = Endpoint::kCompletions, kChat = Endpoint::kChat;
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "temperature": "hot"})"), "temperature");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "n": 0})"), "n");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "n": 65})"), "n");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": ["a", "b"], "n": 40})"), "n");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "max_tokens": 0})"), "max_tokens");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "max_tokens": 1.5})"), "max_tokens");
  EXPECT_EQ(ParamOf(kC, R"({"temperature": 0})"), "prompt");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": ""})"), "prompt");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": []})"), "prompt");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": ["ok", {"a": 1}]})"), "prompt[1]");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": [-1]})"), "prompt");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "logprobs": 21})"), "logprobs");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "logit_bias": {"five": 10}})"), "logit_bias");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "logit_bias": {"5": "up"}})"), "logit_bias");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "suffix": "tail"})"), "suffix");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "best_of": 3})"), "best_of");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "min_tokens": -4})"), "min_tokens");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": [1, 2], "echo": true})"), "echo");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "stop": [1]})"), "stop");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "stream_options": {}})"), "stream_options");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "seed": "s"})"), "seed");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "selection": {"polcy": "quest"}})"), "selection");
  EXPECT_EQ(ParamOf(kChat, R"({"messages": []})"), "messages");
  EXPECT_EQ(ParamOf(kChat, R"({"messages": [{"role": "tool", "content": "x"}]})"),
            "messages[0].tool_call_id");
  EXPECT_EQ(ParamOf(kChat, R"({"messages": [{"role": "function", "content": "x"}]})"),
            "messages[0].role");
  EXPECT_EQ(ParamOf(kChat, R"({"messages": [{"role": "user"}]})"), "messages[0].content");
  EXPECT_EQ(
      ParamOf(kChat, R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})"),
      "messages[0].content[0]");
  EXPECT_EQ(ParamOf(kChat, R"({"messages": [{"role": "user", "content": "x"}],
                               "tools": [{"type": "function"}]})"),
            "tools[0].function");
  EXPECT_EQ(ParamOf(kChat, R"({"messages": [{"role": "user", "content": "x"}],
                               "response_format": {"type": "json_schema"}})"),
            "response_format.json_schema.schema");
  EXPECT_EQ(ParamOf(kChat, R"({"messages": [{"role": "user", "content": "x"}],
                               "response_format": {"type": "yaml"}})"),
            "response_format");
  EXPECT_EQ(ParamOf(kChat, R"({"messages": [{"role": "user", "content": "x"}],
                               "top_logprobs": 2})"),
            "top_logprobs");
  // Nesting is bounded before parsing (deep JSON would exhaust a stack later on).
  std::string deep = R"({"prompt": "x", "selection": )";
  for (int i = 0; i < 40; ++i) deep += R"({"params": )";
  deep += '1';
  deep.append(41, '}');
  EXPECT_EQ(ParamOf(kC, deep), "<none>");
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["})"),
            "<ok>");  // brackets inside strings do not count
  // So are objects of very many members (ordered_json scans the keys before each one: 100,000
  // members took 10 s), in the body and in a schema given as JSON text; a large logit_bias fits.
  std::string wide = R"({"prompt": "x", "logit_bias": {)";
  for (int i = 0; i < 20000; ++i) absl::StrAppend(&wide, i > 0 ? ", " : "", "\"", i, "\": 1");
  absl::StrAppend(&wide, "}}");
  auto refused = ParseRequest(kC, wide, kModel, "req");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(std::string(refused.status().message()).find("too many members"), std::string::npos);
  std::string bias = R"({"prompt": "x", "logit_bias": {)";
  for (int i = 0; i < 5000; ++i) absl::StrAppend(&bias, i > 0 ? ", " : "", "\"", i, "\": -100");
  absl::StrAppend(&bias, "}}");
  EXPECT_EQ(MustParse(kC, bias).calls[0].sampling().logit_bias().size(), 5000u);
  std::string schema = R"({\"type\": \"object\", \"properties\": {)";
  for (int i = 0; i < 20000; ++i) {
    absl::StrAppend(&schema, i > 0 ? ", " : "", "\\\"p", i, "\\\": {}");
  }
  EXPECT_EQ(ParamOf(kC, absl::StrCat(R"({"prompt": "x", "guided_json": ")", schema, R"(}}"})")),
            "guided_json");
  // Not JSON, or not an object: no field to name.
  EXPECT_EQ(ParamOf(kC, "{nope"), "<none>");
  EXPECT_EQ(ParamOf(kC, "[1]"), "<none>");
  // Unknown fields are ignored, as OpenAI clients send many.
  EXPECT_EQ(ParamOf(kC, R"({"prompt": "x", "service_tier": "auto"})"), "<ok>");
}

// Tools: a forced tool_choice becomes the JSON schema the output is held to; the tools go to the
// chat template; bad tools and choices name their field.
TEST(OpenAiParse, ToolsAndForcedToolChoice) {
  const std::string tools = R"("tools": [
      {"type": "function", "function": {"name": "get_weather", "description": "Weather",
       "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
      {"type": "function", "function": {"name": "add",
       "parameters": {"type": "object", "properties": {"a": {"$ref": "#/$defs/N"}},
                      "$defs": {"N": {"type": "integer"}}}}}])";
  const std::string user = R"("messages": [{"role": "user", "content": "Paris?"}])";
  ParsedRequest named = MustParse(Endpoint::kChat, "{" + user + ", " + tools + R"(,
      "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})");
  EXPECT_EQ(named.tool_choice, ParsedRequest::ToolChoice::kNamed);
  EXPECT_EQ(named.tool_name, "get_weather");
  const v1::GenerateRequest& call = named.calls[0];
  EXPECT_EQ(call.sampling().response_format(), "json_schema");
  EXPECT_EQ(json::parse(call.sampling().json_schema())["properties"]["city"]["type"], "string");
  json rendered_tools = json::parse(call.chat().tools_json());
  ASSERT_EQ(rendered_tools.size(), 2u);
  EXPECT_EQ(rendered_tools[1]["function"]["name"], "add");

  ParsedRequest required =
      MustParse(Endpoint::kChat, "{" + user + ", " + tools + R"(, "tool_choice": "required"})");
  EXPECT_EQ(required.tool_choice, ParsedRequest::ToolChoice::kRequired);
  EXPECT_EQ(required.tool_name, "");
  // A union tagged by the name; each tool's own references rebased under $defs.
  json schema = json::parse(required.calls[0].sampling().json_schema());
  EXPECT_EQ(schema["anyOf"][1]["properties"]["name"]["const"], "add");
  EXPECT_EQ(schema["$defs"]["tool1"]["properties"]["a"]["$ref"], "#/$defs/tool1/$defs/N");
  ASSERT_TRUE(JsonSchema::Compile(schema.dump()).ok());

  ParsedRequest none =
      MustParse(Endpoint::kChat, "{" + user + ", " + tools + R"(, "tool_choice": "none"})");
  EXPECT_EQ(none.tool_choice, ParsedRequest::ToolChoice::kOff);
  EXPECT_EQ(none.calls[0].chat().tools_json(), "");
  EXPECT_EQ(none.calls[0].sampling().response_format(), "");

  // A conversation that carries a call and its result.
  ParsedRequest turn = MustParse(Endpoint::kChat, R"({"messages": [
      {"role": "user", "content": "Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
       "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]})");
  const auto& m = turn.calls[0].chat().messages();
  ASSERT_EQ(m.size(), 3);
  EXPECT_EQ(json::parse(m[1].tool_calls_json())[0]["function"]["name"], "get_weather");
  EXPECT_EQ(m[2].role(), "tool");
  EXPECT_EQ(m[2].tool_call_id(), "call_1");

  const Endpoint kChat = Endpoint::kChat;
  EXPECT_EQ(ParamOf(kChat, "{" + user + ", " + tools + "}"), "tool_choice");  // auto
  EXPECT_EQ(ParamOf(kChat, "{" + user + ", " + tools + R"(, "tool_choice": "any"})"),
            "tool_choice");
  EXPECT_EQ(ParamOf(kChat, "{" + user + ", " + tools + R"(, "tool_choice":
                {"type": "function", "function": {"name": "nope"}}})"),
            "tool_choice.function.name");
  EXPECT_EQ(ParamOf(kChat, "{" + user + R"(, "tool_choice": "required"})"), "tool_choice");
  EXPECT_EQ(ParamOf(kChat, "{" + user + ", " + tools + R"(, "tool_choice": "required",
                "response_format": {"type": "json_object"}})"),
            "response_format");
  EXPECT_EQ(ParamOf(kChat, "{" + user + R"(, "tool_choice": "required", "tools": [
                {"type": "function", "function": {"name": "bad name"}}]})"),
            "tools[0].function.name");
  EXPECT_EQ(ParamOf(kChat, "{" + user + R"(, "tool_choice": "required", "tools": [
                {"type": "function", "function": {"name": "f", "parameters":
                 {"type": "object", "properties": {"x": {"type": "string", "pattern": "(?=a)b"}}}}}]})"),
            "tools[0].function.parameters.properties.x.pattern");
  EXPECT_EQ(ParamOf(kChat, "{" + user + R"(, "tool_choice": "required", "tools": [
                {"type": "function", "function": {"name": "f"}},
                {"type": "function", "function": {"name": "f"}}]})"),
            "tools[1].function.name");
  EXPECT_EQ(ParamOf(kChat, R"({"messages": [{"role": "user", "content": "x", "tool_calls": [
                {"function": {"name": "f"}}]}]})"),
            "messages[0].tool_calls");
  // Tools that cannot be called are not compiled: agents send all their tools every turn.
  const std::string two = R"("tools": [
      {"type": "function", "function": {"name": "a", "parameters": {"type": "object",
       "properties": {"city": {"type": "string"}}}}},
      {"type": "function", "function": {"name": "b", "parameters": {"type": "object",
       "properties": {"date": {"type": "string", "pattern": "\\1"}}}}}])";
  EXPECT_EQ(ParamOf(kChat, "{" + user + ", " + two + R"(, "tool_choice": "none"})"), "<ok>");
  EXPECT_EQ(ParamOf(kChat, "{" + user + ", " + two + R"(, "tool_choice":
                {"type": "function", "function": {"name": "a"}}})"),
            "<ok>");
  EXPECT_EQ(ParamOf(kChat, "{" + user + ", " + two + R"(, "tool_choice": "required"})"),
            "tools[1].function.parameters.properties.date.pattern");
  // "required" over up to 64 tools (a union of 64); more is refused naming tool_choice.
  auto many = [&](int n) {
    std::string list = R"("tools": [)";
    for (int i = 0; i < n; ++i) {
      list += absl::StrCat(
          i ? "," : "", R"({"type": "function", "function": {"name": "f)", i,
          R"(", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}})");
    }
    return "{" + user + ", " + list + R"(], "tool_choice": "required"})";
  };
  ParsedRequest r64 = MustParse(kChat, many(64));
  EXPECT_TRUE(JsonSchema::Compile(r64.calls[0].sampling().json_schema()).ok());
  EXPECT_EQ(ParamOf(kChat, many(65)), "tool_choice");
}

TEST(OpenAiErrors, HttpStatusAndType) {
  json e = ErrorBody(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "queue full"));
  EXPECT_EQ(e["error"]["message"], "queue full");
  EXPECT_EQ(e["error"]["type"], "rate_limit_error");
  EXPECT_EQ(e["error"]["code"], "RESOURCE_EXHAUSTED");
  EXPECT_EQ(HttpStatusOf(grpc::StatusCode::RESOURCE_EXHAUSTED), 429);
  EXPECT_EQ(HttpStatusOf(grpc::StatusCode::INVALID_ARGUMENT), 400);
  EXPECT_EQ(HttpStatusOf(grpc::StatusCode::UNAVAILABLE), 503);
  EXPECT_EQ(HttpStatusOf(grpc::StatusCode::DEADLINE_EXCEEDED), 504);
  EXPECT_EQ(HttpStatusOf(grpc::StatusCode::INTERNAL), 500);
}

// What a client assembles from a streamed chat choice: its content, tool-call deltas and
// finish reason.
struct StreamedChoice {
  std::string content, reasoning;
  json calls = json::array();
  std::string finish;
  void Feed(const std::string& events) {
    for (const std::string& e : Events(events)) {
      const json choice = json::parse(e)["choices"][0];
      if (choice["delta"].contains("content") && choice["delta"]["content"].is_string())
        content += choice["delta"]["content"].get<std::string>();
      if (choice["delta"].contains("reasoning_content"))
        reasoning += choice["delta"]["reasoning_content"].get<std::string>();
      if (choice["delta"].contains("tool_calls"))
        for (const json& t : choice["delta"]["tool_calls"]) calls.push_back(t);
      if (choice["finish_reason"].is_string()) finish = choice["finish_reason"];
    }
  }
};

TEST(OpenAiResponse, CompletionBodyGathersTextLogprobsAndUsage) {
  ParsedRequest r = MustParse(Endpoint::kCompletions,
                              R"({"prompt": "x", "logprobs": 1, "n": 2, "max_tokens": 2})");
  ResponseBuilder b(r, "cmpl-1", 123);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(b.OnResponse(i, Chunk("Hel", 10, -0.5f)), "");
    EXPECT_EQ(b.OnResponse(i, Chunk("lo", 11, -1.5f)), "");
  }
  b.OnResponse(0, Complete(v1::FINISH_REASON_LENGTH, 4, 2));
  b.OnResponse(1, Complete(v1::FINISH_REASON_STOP_STRING, 4, 2));
  json body = json::parse(b.Body());
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["id"], "cmpl-1");
  EXPECT_EQ(body["created"], 123);
  EXPECT_EQ(body["model"], kModel.name);
  ASSERT_EQ(body["choices"].size(), 2u);
  const json& c0 = body["choices"][0];
  EXPECT_EQ(c0["text"], "Hello");
  EXPECT_EQ(c0["finish_reason"], "length");
  EXPECT_EQ(body["choices"][1]["finish_reason"], "stop");
  EXPECT_EQ(c0["logprobs"]["tokens"], json({"Hel", "lo"}));
  EXPECT_EQ(c0["logprobs"]["token_logprobs"], json({-0.5, -1.5}));
  EXPECT_EQ(c0["logprobs"]["text_offset"], json({0, 3}));
  EXPECT_EQ(c0["logprobs"]["top_logprobs"][1]["lo"], -1.5);
  EXPECT_EQ(c0["tinyserve"]["worker"], "w1");
  EXPECT_EQ(c0["tinyserve"]["selection"]["policy"], "quest");
  EXPECT_EQ(c0["tinyserve"]["speculative"], json({{"draft_tokens", 7}, {"accepted_tokens", 5}}));
  // n samples of one prompt count its prompt once.
  EXPECT_EQ(body["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(body["usage"]["completion_tokens"], 4);
  EXPECT_EQ(body["usage"]["total_tokens"], 8);
  EXPECT_EQ(body["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
}

TEST(OpenAiResponse, ChatStreamEventsRoleFirstThenDeltasThenUsageAndDone) {
  ParsedRequest r = MustParse(Endpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}],
      "stream": true, "stream_options": {"include_usage": true}, "logprobs": true})");
  ResponseBuilder b(r, "chatcmpl-1", 5);
  std::vector<std::string> ev = Events(b.OnResponse(0, Chunk("Hi", 3, -0.1f)));
  ASSERT_EQ(ev.size(), 1u);
  json first = json::parse(ev[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_TRUE(first["usage"].is_null());
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "Hi");
  EXPECT_EQ(first["choices"][0]["logprobs"]["content"][0]["token"], "Hi");
  EXPECT_EQ(first["choices"][0]["logprobs"]["content"][0]["bytes"], json({72, 105}));
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  json second = json::parse(Events(b.OnResponse(0, Chunk("!", 4, -0.2f)))[0]);
  EXPECT_FALSE(second["choices"][0]["delta"].contains("role"));
  EXPECT_EQ(second["choices"][0]["delta"]["content"], "!");
  json last = json::parse(Events(b.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 7, 2)))[0]);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  std::vector<std::string> end = Events(b.StreamEnd());
  ASSERT_EQ(end.size(), 2u);
  json usage = json::parse(end[0]);
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"]["total_tokens"], 9);
  EXPECT_EQ(end[1], "[DONE]");
}

TEST(OpenAiResponse, EchoLeadsTheTextAndFailuresBecomeErrorEvents) {
  ParsedRequest r =
      MustParse(Endpoint::kCompletions, R"({"prompt": "Once", "echo": true, "stream": true})");
  ResponseBuilder b(r, "cmpl-2", 5);
  json first = json::parse(Events(b.OnResponse(0, Chunk(" upon", 1, 0)))[0]);
  EXPECT_EQ(first["choices"][0]["text"], "Once upon");
  json err = json::parse(
      Events(b.OnFailure(0, grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker gone")))[0]);
  EXPECT_EQ(err["error"]["message"], "worker gone");
  EXPECT_EQ(err["error"]["type"], "service_unavailable_error");
}

TEST(OpenAiResponse, PromptLogprobsInBothForms) {
  // The first chunk carries one entry per prompt token; the first has no context.
  v1::GenerateResponse first = Chunk(" upon", 9, -0.5f);
  const std::pair<int, float> prompt[] = {{5, 0.0f}, {6, -1.25f}};
  for (const auto& [id, lp] : prompt) {
    v1::TokenLogprobs* p = first.mutable_chunk()->add_prompt_logprobs();
    p->set_token_id(id);
    p->set_logprob(lp);
    p->set_rank(id == 5 ? 0 : 3);
    p->set_text(id == 5 ? "Once" : " more");
    if (id == 6) {
      v1::TopLogprob* t = p->add_top();
      t->set_token_id(7);
      t->set_logprob(-0.25f);
      t->set_text(" upon");
    }
  }
  // vLLM's prompt_logprobs: [null, {"id": {logprob, rank, decoded_token}}...], not streamed
  // and in a stream's first event.
  for (bool stream : {false, true}) {
    ParsedRequest r = MustParse(Endpoint::kCompletions,
                                std::string(R"({"prompt": "Once more", "prompt_logprobs": 1)") +
                                    (stream ? R"(, "stream": true})" : "}"));
    ResponseBuilder b(r, "cmpl-3", 5);
    json choice;
    const std::string events = b.OnResponse(0, first);
    if (stream) {
      choice = json::parse(Events(events)[0])["choices"][0];
    } else {
      b.OnResponse(0, Complete(v1::FINISH_REASON_LENGTH, 2, 1));
      choice = json::parse(b.Body())["choices"][0];
    }
    const json& pl = choice["prompt_logprobs"];
    ASSERT_EQ(pl.size(), 2u) << choice;
    EXPECT_TRUE(pl[0].is_null());
    EXPECT_EQ(pl[1]["6"]["rank"], 3);
    EXPECT_FLOAT_EQ(pl[1]["6"]["logprob"].get<float>(), -1.25f);
    EXPECT_EQ(pl[1]["6"]["decoded_token"], " more");
    EXPECT_EQ(pl[1]["7"]["rank"], 1);
  }
  // echo with logprobs: the prompt's tokens lead the legacy logprobs, the first null.
  ParsedRequest e =
      MustParse(Endpoint::kCompletions, R"({"prompt": "Once more", "echo": true, "logprobs": 1})");
  EXPECT_EQ(e.calls[0].sampling().prompt_logprobs(), 1);
  ResponseBuilder eb(e, "cmpl-4", 5);
  eb.OnResponse(0, first);
  eb.OnResponse(0, Complete(v1::FINISH_REASON_LENGTH, 2, 1));
  json lp = json::parse(eb.Body())["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json::parse(R"(["Once", " more", " upon"])"));
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_FLOAT_EQ(lp["token_logprobs"][1].get<float>(), -1.25f);
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(lp["text_offset"], json::parse("[0, 4, 9]"));
}

TEST(OpenAiResponse, ForcedToolCallsBecomeToolCallsStreamedOrNot) {
  const std::string body = R"({"messages": [{"role": "user", "content": "Paris?"}],
      "tools": [{"type": "function", "function": {"name": "get_weather"}},
                {"type": "function", "function": {"name": "add"}}], "tool_choice": "required")";
  ParsedRequest r = MustParse(Endpoint::kChat, body + "}");
  ResponseBuilder b(r, "chatcmpl-1", 5);
  b.OnResponse(0, Chunk(R"({"name": "add", )", 3, -0.1f));
  b.OnResponse(0, Chunk(R"("arguments": {"a": 1}})", 4, -0.1f));
  b.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 7, 2));
  json out = json::parse(b.Body());
  const json& message = out["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null());
  ASSERT_EQ(message["tool_calls"].size(), 1u);
  EXPECT_EQ(message["tool_calls"][0]["type"], "function");
  EXPECT_EQ(message["tool_calls"][0]["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "add");
  EXPECT_EQ(json::parse(message["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json::parse(R"({"a": 1})"));
  EXPECT_EQ(out["choices"][0]["finish_reason"], "tool_calls");

  // Streamed: nothing until the call is whole, then the call, then the finish reason.
  ParsedRequest s = MustParse(Endpoint::kChat, body + R"(, "stream": true})");
  ResponseBuilder sb(s, "chatcmpl-2", 5);
  EXPECT_EQ(sb.OnResponse(0, Chunk(R"({"name": "get_weather", "arguments": {}})", 3, -0.1f)), "");
  std::vector<std::string> ev = Events(sb.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 7, 2)));
  ASSERT_EQ(ev.size(), 2u);
  json call = json::parse(ev[0])["choices"][0]["delta"];
  EXPECT_EQ(call["role"], "assistant");
  EXPECT_EQ(call["tool_calls"][0]["index"], 0);
  EXPECT_EQ(call["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(ev[1])["choices"][0]["finish_reason"], "tool_calls");

  // Named: the output is the arguments, the finish reason "stop"; cut short, it stays text.
  ParsedRequest n = MustParse(Endpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "f"}}})");
  ResponseBuilder nb(n, "chatcmpl-3", 5);
  nb.OnResponse(0, Chunk("{}", 3, -0.1f));
  nb.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 7, 1));
  json named = json::parse(nb.Body());
  EXPECT_EQ(named["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{}");
  EXPECT_EQ(named["choices"][0]["finish_reason"], "stop");
  ResponseBuilder cut(n, "chatcmpl-4", 5);
  cut.OnResponse(0, Chunk("{\"x\": ", 3, -0.1f));
  cut.OnResponse(0, Complete(v1::FINISH_REASON_LENGTH, 7, 1));
  json text = json::parse(cut.Body());
  EXPECT_EQ(text["choices"][0]["message"]["content"], "{\"x\": ");
  EXPECT_EQ(text["choices"][0]["finish_reason"], "length");
  // Whatever the constraint allowed is passed through as written (1e400 does not fit a double).
  ResponseBuilder big(r, "chatcmpl-5", 5);
  big.OnResponse(0, Chunk("{\"name\": \"add\", \"arguments\": {\"a\": 1e400} }\n", 3, -0.1f));
  big.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 7, 1));
  json passed = json::parse(big.Body());
  EXPECT_EQ(passed["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            "{\"a\": 1e400}");
  // Streamed with logprobs: they ride on the call's chunk.
  ParsedRequest lp = MustParse(Endpoint::kChat, body + R"(, "stream": true, "logprobs": true})");
  ResponseBuilder lb(lp, "chatcmpl-6", 5);
  lb.OnResponse(0, Chunk(R"({"name": "add", "arguments": {}})", 3, -0.25f));
  std::vector<std::string> lev = Events(lb.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 7, 1)));
  ASSERT_EQ(lev.size(), 2u);
  EXPECT_EQ(json::parse(lev[0])["choices"][0]["logprobs"]["content"][0]["logprob"], -0.25f);
}

// A "type" that is not a string is a 400 naming the field, not a crash (json::value would throw;
// found by openai_api_fuzz).
TEST(OpenAiParse, NonStringTypesAreRefusedNotThrown) {
  const std::string user = R"("messages": [{"role": "user", "content": "x"}])";
  const Endpoint kChat = Endpoint::kChat;
  EXPECT_EQ(ParamOf(kChat, "{" + user + R"(, "tools": [{"type": {"name": "f"}}]})"),
            "tools[0].type");
  EXPECT_EQ(ParamOf(kChat, R"({"messages": [{"role": "user", "content": [{"type": 1}]}]})"),
            "messages[0].content[0]");
  EXPECT_EQ(ParamOf(kChat, "{" + user + R"(, "response_format": {"type": ["json_object"]}})"),
            "response_format");
  EXPECT_EQ(ParamOf(kChat, "{" + user +
                               R"(, "tools": [{"type": "function", "function": {"name": "f"}}],
                                  "tool_choice": {"type": {}}})"),
            "tool_choice");
}

// --reasoning-parser (vLLM's qwen3 and deepseek_r1): the <think> block becomes
// reasoning_content, whole or streamed; with tool_choice "auto" the calls come from the answer.
TEST(OpenAiResponse, ReasoningParsers) {
  const std::string body = R"({"messages": [{"role": "user", "content": "2+2?"}])";
  auto run = [&](const std::string& parser, const std::vector<std::string>& chunks,
                 const std::string& extra = "") {
    const ServedModel m{"m", 8192, {}, "hermes", parser};
    auto r = ParseRequest(Endpoint::kChat, body + extra + "}", m, "req");
    EXPECT_TRUE(r.ok()) << r.status();
    ResponseBuilder b(*r, "chatcmpl-r", 5);
    for (const std::string& c : chunks) b.OnResponse(0, Chunk(c, 3, -0.1f));
    b.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 7, 2));
    return json::parse(b.Body())["choices"][0]["message"];
  };
  json msg = run("qwen3", {"<think>", "\nSum.\n", "</think>", "\n\n4"});
  EXPECT_EQ(msg["reasoning_content"], "\nSum.\n");
  EXPECT_EQ(msg["content"], "\n\n4");
  // qwen3 wants both tags; deepseek_r1 reads a missing <think> (the template wrote it) and an
  // unclosed block as all reasoning.
  msg = run("qwen3", {"Sum.</think>4"});
  EXPECT_FALSE(msg.contains("reasoning_content"));
  EXPECT_EQ(msg["content"], "Sum.</think>4");
  msg = run("qwen3", {"<think>still thinking"});
  EXPECT_EQ(msg["content"], "<think>still thinking");
  msg = run("deepseek_r1", {"Sum.</think>4"});
  EXPECT_EQ(msg["reasoning_content"], "Sum.");
  EXPECT_EQ(msg["content"], "4");
  msg = run("deepseek_r1", {"<think>still"});
  EXPECT_EQ(msg["reasoning_content"], "still");
  EXPECT_TRUE(msg["content"].is_null());
  msg = run("", {"<think>x</think>y"});  // no parser: untouched
  EXPECT_EQ(msg["content"], "<think>x</think>y");
  EXPECT_FALSE(msg.contains("reasoning_content"));
  // With tools and "auto": the calls are read from the answer only.
  const std::string tools = R"(, "tools": [{"type": "function", "function": {"name": "add"}}])";
  msg = run("qwen3",
            {"<think>call <tool_call>?</think>",
             "ok <tool_call>{\"name\": \"add\", "
             "\"arguments\": {}}</tool_call>"},
            tools);
  EXPECT_EQ(msg["reasoning_content"], "call <tool_call>?");
  EXPECT_EQ(msg["content"], "ok ");
  ASSERT_EQ(msg["tool_calls"].size(), 1u);

  // Streamed: reasoning deltas as the block grows (a partial "</think>" waits), then content.
  for (const std::string& extra : {std::string(""), tools}) {
    const ServedModel m{"m", 8192, {}, "hermes", "qwen3"};
    auto r = ParseRequest(Endpoint::kChat, body + extra + R"(, "stream": true})", m, "req");
    ASSERT_TRUE(r.ok()) << r.status();
    ResponseBuilder b(*r, "chatcmpl-s", 5);
    StreamedChoice got;
    got.Feed(b.OnResponse(0, Chunk("<thi", 3, -0.1f)));
    EXPECT_EQ(got.reasoning + got.content, "");  // may become "<think>"
    got.Feed(b.OnResponse(0, Chunk("nk>\nSum", 3, -0.1f)));
    EXPECT_EQ(got.reasoning, "\nSum");
    got.Feed(b.OnResponse(0, Chunk(".</thi", 3, -0.1f)));
    EXPECT_EQ(got.reasoning, "\nSum.");
    got.Feed(b.OnResponse(0, Chunk("nk>\n\n4", 3, -0.1f)));
    EXPECT_EQ(got.reasoning, "\nSum.");
    EXPECT_EQ(got.content, "\n\n4");
    got.Feed(b.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 7, 4)));
    EXPECT_EQ(got.content, "\n\n4");
    EXPECT_EQ(got.finish, "stop");
  }
  // Streamed deepseek_r1 without the opening tag: reasoning from the first byte.
  const ServedModel r1{"m", 8192, {}, "", "deepseek_r1"};
  auto r = ParseRequest(Endpoint::kChat, body + R"(, "stream": true})", r1, "req");
  ASSERT_TRUE(r.ok());
  ResponseBuilder b(*r, "chatcmpl-d", 5);
  StreamedChoice got;
  got.Feed(b.OnResponse(0, Chunk("Sum.</think>4", 3, -0.1f)));
  got.Feed(b.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 7, 1)));
  EXPECT_EQ(got.reasoning, "Sum.");
  EXPECT_EQ(got.content, "4");
}

TEST(OpenAiResponse, TheWorkerSaysWhereThePromptLeftTheBlock) {
  // Chunk.reasoning_start overrides the parser's guess: a block the prompt opened (a Qwen3
  // thinking template) is read under qwen3 too, and one it closed (thinking off) leaves
  // deepseek_r1's output all answer. Streamed and not; the parse sets reasoning_format.
  const std::string body = R"({"messages": [{"role": "user", "content": "2+2?"}])";
  for (const bool stream : {false, true}) {
    for (const auto& [parser, start, reasoning, content] :
         {std::tuple{"qwen3", v1::REASONING_START_OPEN, "Sum.", "4"},
          std::tuple{"deepseek_r1", v1::REASONING_START_CLOSED, "", "Sum.</think>4"},
          std::tuple{"qwen3", v1::REASONING_START_IDLE, "", "Sum.</think>4"}}) {
      const ServedModel m{"m", 8192, {}, "", parser};
      auto r =
          ParseRequest(Endpoint::kChat, body + (stream ? R"(, "stream": true})" : "}"), m, "req");
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->calls[0].sampling().reasoning_format(), parser);
      ResponseBuilder b(*r, "chatcmpl-w", 5);
      v1::GenerateResponse first = Chunk("Sum.</thi", 3, -0.1f);
      first.mutable_chunk()->set_reasoning_start(start);
      StreamedChoice got;
      got.Feed(b.OnResponse(0, first));
      got.Feed(b.OnResponse(0, Chunk("nk>4", 3, -0.1f)));
      got.Feed(b.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 7, 2)));
      if (!stream) {
        const json msg = json::parse(b.Body())["choices"][0]["message"];
        got.reasoning = msg.value("reasoning_content", "");
        got.content = msg["content"];
      }
      EXPECT_EQ(got.reasoning, reasoning) << parser << " " << start << " " << stream;
      EXPECT_EQ(got.content, content) << parser << " " << start << " " << stream;
    }
  }
  // Streamed qwen3: whitespace before <think> (which the worker allows) is not content.
  const ServedModel q{"m", 8192, {}, "", "qwen3"};
  auto r = ParseRequest(Endpoint::kChat, body + R"(, "stream": true})", q, "req");
  ASSERT_TRUE(r.ok());
  ResponseBuilder b(*r, "chatcmpl-q", 5);
  StreamedChoice got;
  got.Feed(b.OnResponse(0, Chunk("\n", 3, -0.1f)));
  EXPECT_EQ(got.reasoning + got.content, "");  // may still open a block
  got.Feed(b.OnResponse(0, Chunk("<think>Sum.</think>4", 3, -0.1f)));
  got.Feed(b.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 7, 2)));
  EXPECT_EQ(got.reasoning, "Sum.");
  EXPECT_EQ(got.content, "4");
}

// tool_choice "auto" with the hermes parser: free output; <tool_call> blocks naming a tool
// become calls, the text before them the content; anything else stays text.
TEST(OpenAiResponse, AutoToolChoiceParsesHermesToolCalls) {
  const ServedModel hermes{"m", 8192, {}, "hermes", ""};
  const std::string body = R"({"messages": [{"role": "user", "content": "Paris?"}],
      "tools": [{"type": "function", "function": {"name": "get_weather"}},
                {"type": "function", "function": {"name": "add"}}])";
  // Refused without a parser; with one, absent and "auto" are the same.
  EXPECT_EQ(ParamOf(Endpoint::kChat, body + "}"), "tool_choice");
  for (const std::string& choice : {std::string(""), std::string(R"(, "tool_choice": "auto")")}) {
    auto r = ParseRequest(Endpoint::kChat, body + choice + "}", hermes, "req");
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->tool_choice, ParsedRequest::ToolChoice::kAuto);
    EXPECT_EQ(r->calls[0].sampling().response_format(), "");  // no constraint
    EXPECT_NE(r->calls[0].chat().tools_json().find("get_weather"), std::string::npos);
  }
  auto parsed = ParseRequest(Endpoint::kChat, body + "}", hermes, "req");
  ASSERT_TRUE(parsed.ok());
  const ParsedRequest& r = *parsed;
  auto run = [&](const std::vector<std::string>& chunks, v1::FinishReason reason) {
    ResponseBuilder b(r, "chatcmpl-a", 5);
    for (const std::string& c : chunks) b.OnResponse(0, Chunk(c, 3, -0.1f));
    b.OnResponse(0, Complete(reason, 7, 2));
    return json::parse(b.Body())["choices"][0];
  };
  json c = run({"Let me check. <tool_", "call>\n{\"name\": \"get_weather\", \"arguments\": ",
                "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"add\", "
                "\"arguments\": {\"a\": 1}}</tool_call>"},
               v1::FINISH_REASON_EOS);
  EXPECT_EQ(c["message"]["content"], "Let me check. ");
  ASSERT_EQ(c["message"]["tool_calls"].size(), 2u);
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(c["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json::parse(R"({"city": "Paris"})"));
  EXPECT_EQ(c["message"]["tool_calls"][1]["function"]["name"], "add");
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  // Only a call: content null. An unknown function, bad JSON or no block: plain text.
  c = run({"<tool_call>{\"name\": \"add\", \"arguments\": {}}</tool_call>"}, v1::FINISH_REASON_EOS);
  EXPECT_TRUE(c["message"]["content"].is_null());
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["arguments"], "{}");
  // Arguments are JSON text whatever their type; a call without arguments, or nested deeper
  // than the API allows (the output is untrusted: a guided regex can make it anything), is text.
  c = run({"<tool_call>{\"name\": \"add\", \"arguments\": \"x\"}</tool_call>"},
          v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["arguments"], "\"x\"");
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  const std::string deep =
      "<tool_call>{\"name\": \"add\", \"arguments\": " + std::string(100, '[') +
      std::string(100, ']') + "}</tool_call>";
  for (const std::string& text : {std::string("<tool_call>{\"name\": \"nope\"}</tool_call>"),
                                  std::string("<tool_call>{\"name\": </tool_call>"),
                                  std::string("<tool_call>{\"name\": \"add\"}</tool_call>"), deep,
                                  std::string("It is sunny.")}) {
    c = run({text}, v1::FINISH_REASON_EOS);
    EXPECT_EQ(c["message"]["content"], text);
    EXPECT_FALSE(c["message"].contains("tool_calls")) << text;
    EXPECT_EQ(c["finish_reason"], "stop");
  }

  // Streamed: content flows until the marker (a partial one waits), then the calls, then the
  // finish reason.
  auto s = ParseRequest(Endpoint::kChat, body + R"(, "stream": true})", hermes, "req");
  ASSERT_TRUE(s.ok());
  ResponseBuilder sb(*s, "chatcmpl-s", 5);
  StreamedChoice got;
  std::string& content = got.content;
  json& calls = got.calls;
  std::string& finish = got.finish;
  auto feed = [&](const std::string& events) { got.Feed(events); };
  feed(sb.OnResponse(0, Chunk("Checking <tool", 3, -0.1f)));
  EXPECT_EQ(content, "Checking ");  // "<tool" may begin the marker: held back
  feed(sb.OnResponse(0, Chunk("_call>{\"name\": \"add\", \"arguments\": {\"a\": 2}}", 4, -0.1f)));
  EXPECT_TRUE(calls.empty());
  feed(sb.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 7, 2)));
  EXPECT_EQ(content, "Checking ");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["index"], 0);
  EXPECT_EQ(calls[0]["function"]["name"], "add");
  EXPECT_EQ(finish, "tool_calls");
  // A held-back "<" that turns out to be text is sent at the end.
  ResponseBuilder tb(*s, "chatcmpl-t", 5);
  content.clear();
  feed(tb.OnResponse(0, Chunk("a <", 3, -0.1f)));
  EXPECT_EQ(content, "a ");
  feed(tb.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 7, 1)));
  EXPECT_EQ(content, "a <");
}

}  // namespace
// tool_choice "auto" with the llama3_json parser (Llama 3.x's format, as vLLM reads it): an
// output that begins with a JSON object (or <|python_tag|>) is calls separated by ";", each
// {"name", "parameters" or "arguments"}; anything else is content.
TEST(OpenAiResponse, AutoToolChoiceParsesLlama3JsonToolCalls) {
  const ServedModel llama3{"m", 8192, {}, "llama3_json", ""};
  const std::string body = R"({"messages": [{"role": "user", "content": "Paris?"}],
      "tools": [{"type": "function", "function": {"name": "get_weather"}},
                {"type": "function", "function": {"name": "add"}}])";
  auto parsed = ParseRequest(Endpoint::kChat, body + "}", llama3, "req");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->tool_choice, ParsedRequest::ToolChoice::kAuto);
  auto run = [&](const std::vector<std::string>& chunks) {
    ResponseBuilder b(*parsed, "chatcmpl-a", 5);
    for (const std::string& c : chunks) b.OnResponse(0, Chunk(c, 3, -0.1f));
    b.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 7, 2));
    return json::parse(b.Body())["choices"][0];
  };
  json c = run({" {\"name\": \"get_weather\", ", "\"parameters\": {\"city\": \"Paris\"}}"});
  EXPECT_TRUE(c["message"]["content"].is_null());
  ASSERT_EQ(c["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(c["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json::parse(R"({"city": "Paris"})"));
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  c =
      run({"<|python_tag|>{\"name\": \"add\", \"arguments\": {\"a\": \"}\"}}; "
           "{\"name\": \"get_weather\", \"parameters\": {}}"});
  ASSERT_EQ(c["message"]["tool_calls"].size(), 2u);
  EXPECT_EQ(json::parse(c["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json::parse(R"({"a": "}"})"));  // a brace inside a string does not end the call
  EXPECT_EQ(c["message"]["tool_calls"][1]["function"]["arguments"], "{}");
  for (const std::string& text :
       {std::string("It is sunny."), std::string("{\"name\": \"nope\", \"parameters\": {}}"),
        std::string("{\"name\": \"add\", \"parameters\": {}} and more"),
        std::string("{\"name\": \"add\"}"), std::string("{\"name\": \"add\", \"parameters\": {"),
        std::string("Sure: {\"name\": \"add\", \"parameters\": {}}"),
        "{\"name\": \"add\", \"parameters\": " + std::string(100, '[') + std::string(100, ']') +
            "}"}) {
    c = run({text});
    EXPECT_EQ(c["message"]["content"], text);
    EXPECT_FALSE(c["message"].contains("tool_calls")) << text;
    EXPECT_EQ(c["finish_reason"], "stop");
  }

  // Streamed: nothing goes out while the output may begin a call; text that cannot is content
  // at once.
  auto s = ParseRequest(Endpoint::kChat, body + R"(, "stream": true})", llama3, "req");
  ASSERT_TRUE(s.ok());
  StreamedChoice got;
  std::string& content = got.content;
  json& calls = got.calls;
  std::string& finish = got.finish;
  auto feed = [&](const std::string& events) { got.Feed(events); };
  ResponseBuilder sb(*s, "chatcmpl-s", 5);
  feed(sb.OnResponse(0, Chunk("<|pyth", 3, -0.1f)));
  feed(sb.OnResponse(0, Chunk("on_tag|>{\"name\": \"add\", ", 3, -0.1f)));
  feed(sb.OnResponse(0, Chunk("\"parameters\": {\"a\": 2}}", 3, -0.1f)));
  EXPECT_EQ(content, "");
  feed(sb.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 7, 3)));
  EXPECT_EQ(content, "");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["function"]["name"], "add");
  EXPECT_EQ(finish, "tool_calls");
  ResponseBuilder tb(*s, "chatcmpl-t", 5);
  feed(tb.OnResponse(0, Chunk(" ", 3, -0.1f)));
  EXPECT_EQ(content, "");  // only whitespace: undecided
  feed(tb.OnResponse(0, Chunk("Sunny {", 3, -0.1f)));
  EXPECT_EQ(content, " Sunny {");
  feed(tb.OnResponse(0, Chunk("\"a\"}", 3, -0.1f)));
  EXPECT_EQ(content, " Sunny {\"a\"}");
  feed(tb.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 7, 3)));
  EXPECT_EQ(content, " Sunny {\"a\"}");
  EXPECT_EQ(finish, "stop");
}

}  // namespace tinyserve::openai
