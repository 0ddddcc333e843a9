// File: worker/server/openai_api.h
// The OpenAI-compatible HTTP API (POST /v1/completions and /v1/chat/completions), translated
// to and from tinyserve.v1 messages. No I/O here: http_frontend.h owns the sockets and the
// gRPC calls; this file turns a JSON body into the Generate calls to run and turns their
// responses into OpenAI JSON objects or server-sent events.
//
// Request fields (OpenAI's, then vLLM's extras):
//   completions: prompt (a string, token ids, or a list of either: one choice set per prompt),
//                echo (text prompts only), suffix (rejected unless empty);
//   chat:        messages (role system/developer/user/assistant/tool; content a string or a
//                list of {"type": "text"} parts; an assistant turn's tool_calls, a tool turn's
//                tool_call_id), max_completion_tokens, logprobs + top_logprobs, tools with
//                tool_choice "none", "required" or {"type": "function", "function": {"name"}},
//                and "auto" (also when tool_choice is absent) when the frontend has a tool-call
//                parser (ServedModel::tool_call_parser; refused otherwise);
//   both:        model (echoed back; any name serves the one loaded model), max_tokens
//                (completions default 16; chat default: the rest of the context), temperature
//                (default 1), top_p, n (1..64), stop (a string or a list), seed, stream,
//                stream_options.include_usage, presence_penalty, frequency_penalty, user,
//                logit_bias, response_format ({"type": "text"} or {"type": "json_object"});
//                extras top_k (-1 or 0 = off), min_p, repetition_penalty,
//                stop_token_ids, ignore_eos, min_tokens, cache_salt, priority, request_id, and
//                TinyServe's "selection" object (tinyserve.v1.SelectionOptions
//                in its JSON form: {"policy": "quest", "budget": 1024, ...}).
// Unknown fields are ignored, as OpenAI clients send many; fields we know but do not implement
// are rejected when set to anything but their neutral value, so nothing is silently dropped.
//
// Errors: INVALID_ARGUMENT whose message starts with the field ("temperature: ..."); the field
// is also attached as the payload kParamPayload, for the error object's "param".
//
// Thread safety: free functions are pure; a ResponseBuilder belongs to one HTTP request.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/support/status.h"
#include "nlohmann/json.hpp"
#include "tinyserve/v1/tinyserve.pb.h"

namespace tinyserve::openai {

// JSON with keys in insertion order: request schemas keep their property order (it is the order
// json_schema output is written in) and responses read in OpenAI's field order.
using Json = nlohmann::ordered_json;

enum class Endpoint { kCompletions, kChat, kResponses, kMessages };

// The absl::Status payload key holding the request field an INVALID_ARGUMENT error is about.
inline constexpr char kParamPayload[] = "tinyserve.openai/param";

// What the frontend knows of the served model.
struct ServedModel {
  std::string name;
  int max_context = 0;
  // The LoRA adapters loaded: a request whose "model" names one runs with it. With any loaded,
  // a "model" that is neither the base model's name nor an adapter's is a 404 (vLLM's
  // "model does not exist"); with none, any "model" is served by the base model.
  std::vector<std::string> loras;
  // HttpFrontendOptions::tool_call_parser: with one, tool_choice "auto" is served and the
  // output's calls in that format become tool calls. "hermes": <tool_call>{...}</tool_call>
  // blocks; "llama3_json": an output that is JSON objects {"name", "parameters" or
  // "arguments"} separated by ";" (after an optional <|python_tag|>), Llama 3.x's format.
  // Empty: "auto" is refused.
  std::string tool_call_parser;
  // HttpFrontendOptions::reasoning_parser: "qwen3" or "deepseek_r1" (SplitReasoning); empty:
  // none.
  std::string reasoning_parser;
};

// Where a thinking model's answer puts its reasoning (vLLM's reasoning parsers): the text
// reasoning_begin..reasoning_end is the <think> block's inside, content_begin.. the answer.
// "qwen3": a block only when the text holds both <think> and </think> (else it is all
// content); "deepseek_r1": the <think> may be missing (the template wrote it) and a block
// never closed is all reasoning. final=false (streaming, the text still growing): an open
// <think> block counts as reasoning, and `stable` ends before any tail that could still become
// a tag (send nothing past it yet).
struct ReasoningSplit {
  size_t reasoning_begin = 0, reasoning_end = 0, content_begin = 0, stable = 0;
};
ReasoningSplit SplitReasoning(std::string_view text, const std::string& parser, bool final);

// One OpenAI request: Generate calls[i] produces choice i (prompt p, sample j: i = p * n + j).
struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::vector<tinyserve::v1::GenerateRequest> calls;
  std::vector<std::string> echo;  // per call: text to put before the output (empty: none)
  int n = 1;                      // samples per prompt
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;  // report logprobs (completions: "logprobs" was set)
  bool prompt_logprobs = false;  // vLLM's "prompt_logprobs" was set: report them in its form
  bool echo_logprobs = false;    // completions echo with logprobs: the prompt's lead them
  std::string model;      // the name responses carry
  // Chat with tools and tool_choice naming a function (kNamed) or "required": each choice's
  // output is a tool call, held to the function's parameter schema by constrained decoding.
  // kAuto: the output is free; <tool_call> blocks in it naming one of tool_names become calls.
  enum class ToolChoice { kOff, kNamed, kRequired, kAuto };
  ToolChoice tool_choice = ToolChoice::kOff;
  std::vector<std::string> tool_names;  // kAuto: the functions a call may name
  std::string tool_parser;              // kAuto: ServedModel::tool_call_parser
  std::string reasoning_parser;         // chat: ServedModel::reasoning_parser
  // The function called when there is one candidate (the output is its arguments); empty with
  // several (the output is {"name": ..., "arguments": {...}}, a tagged union of the tools).
  std::string tool_name;
  // kResponses: the request fields the response object echoes (instructions, tools, text,
  // metadata, ...; openai_responses.h).
  Json responses;
  // kResponses: this request's input items (a string input as one user message), what the
  // response store keeps beside the response.
  Json responses_input;
};

// Deepest nesting of objects and arrays a body may have (checked before parsing).
inline constexpr int kMaxJsonDepth = 32;

// A request body: a JSON object nested at most kMaxJsonDepth deep, else INVALID_ARGUMENT.
absl::StatusOr<Json> ParseBody(std::string_view body);

// POST /v1/embeddings: input (a string, token ids, or a list of either), model (an adapter's
// name selects it, as for completions), encoding_format "float" (default) or "base64" (sets
// *base64), and the extras normalize (default true: unit vectors, as OpenAI's are), pooling
// ("last", the default, or "mean"), add_special_tokens, priority, cache_salt, request_id;
// dimensions is refused. Text is tokenized with special tokens parsed, as completions do.
absl::StatusOr<tinyserve::v1::EmbedRequest> ParseEmbeddingsRequest(std::string_view body,
                                                                   const ServedModel& model,
                                                                   bool* base64);
// OpenAI's embeddings list object ("usage" counts prompt tokens only).
Json EmbeddingsResponse(const tinyserve::v1::EmbedResponse& response, const std::string& model,
                        bool base64);

// Parses and checks a request body of /v1/completions or /v1/chat/completions (the Responses
// API's is openai_responses.h's). request_id names the calls (request_id-i).
absl::StatusOr<ParsedRequest> ParseRequest(Endpoint endpoint, std::string_view body,
                                           const ServedModel& model, const std::string& request_id);
// The same for a parsed body.
absl::StatusOr<ParsedRequest> ParseRequestJson(Endpoint endpoint, const Json& body,
                                               const ServedModel& model,
                                               const std::string& request_id);

// HTTP status for a gRPC status (INVALID_ARGUMENT 400, RESOURCE_EXHAUSTED 429, ...).
int HttpStatusOf(grpc::StatusCode code);
// The OpenAI error object {"error": {"message", "type", "param", "code"}}. "param" is `param`;
// unset, it is the field a 400's message starts with (TinyServe's messages name it first).
Json ErrorBody(const grpc::Status& status, std::optional<std::string> param = std::nullopt);
// The same for an absl::Status, with "param" taken from its kParamPayload.
Json ErrorBody(const absl::Status& status);

// Builds the answer from the calls' responses, in arrival order. For a streamed request,
// OnResponse returns the server-sent events to send now; otherwise it keeps what Body() needs.
class AnswerBuilder {
 public:
  virtual ~AnswerBuilder() = default;
  // A message of call `index`.
  virtual std::string OnResponse(int index, const tinyserve::v1::GenerateResponse& response) = 0;
  // Call `index` ended with a non-OK status (after OnResponse calls, if any). Streamed: the
  // error event to send. Otherwise the status is kept; Body() is not used then.
  virtual std::string OnFailure(int index, const grpc::Status& status) = 0;
  // Streamed: the last events.
  virtual std::string StreamEnd() = 0;
  // Not streamed: the JSON body once every call completed.
  virtual std::string Body() const = 0;
};

// The answer of /v1/completions and /v1/chat/completions: events "data: {chunk}\n\n", ending
// with the usage chunk when asked for and "data: [DONE]".
class ResponseBuilder final : public AnswerBuilder {
 public:
  ResponseBuilder(const ParsedRequest& request, std::string id, int64_t created);

  std::string OnResponse(int index, const tinyserve::v1::GenerateResponse& response) override;
  std::string OnFailure(int index, const grpc::Status& status) override;
  std::string StreamEnd() override;
  std::string Body() const override;

  // What OnResponse sends, as chunk objects (empty when not streamed).
  std::vector<Json> Chunks(int index, const tinyserve::v1::GenerateResponse& response);
  // The body Body() writes.
  Json BodyJson() const;
  // The usage object of the choices completed so far ({"prompt_tokens", ...}).
  Json Usage() const;
  // TinyServe's figures of completed choice `index` (worker, timing, page selection).
  Json Stats(int index) const;

 private:
  struct Choice {
    std::string text;
    Json logprobs;            // completions: {tokens, ...}; chat: {content: [...]}
    int text_offset = 0;      // completions logprobs: bytes of text so far
    std::string finish_reason;
    bool started = false;  // streamed: the first event was sent
    tinyserve::v1::Complete complete;
    Json tool_calls;       // the calls the output makes (an array), else null
    Json content;          // with tool_calls: the message content (null or the text before them)
    size_t sent = 0;       // tool_choice "auto", streamed: bytes of text sent as content so far
    Json prompt_logprobs;  // vLLM's form: [null, {"id": {logprob, rank, decoded_token}}, ...]
    // With a reasoning parser: the <think> block's text (not streamed; null: none), and,
    // streamed, how far into `text` the reasoning deltas went.
    Json reasoning;
    size_t rsent = 0;
    // The reasoning parser for this choice's text: the request's, or, once the first chunk
    // says where the prompt left the <think> block, one that reads it so (an open block:
    // deepseek_r1's rules; a closed one: none).
    std::optional<std::string> parser;
  };
  const std::string& ParserOf(const Choice& choice) const {
    return choice.parser.has_value() ? *choice.parser : request_.reasoning_parser;
  }
  // Streamed with a reasoning parser: the reasoning not sent yet (advancing choice.rsent) and
  // the answer so far (the text after the <think> block; what may still be a tag held back).
  // done: the output is complete (nothing is held back).
  std::string StreamReasoning(Choice& choice, bool done, std::string* answer) const;
  // Chunks() when streamed with a reasoning parser (tool_choice off or "auto"): reasoning
  // deltas as the block grows, then the answer as the plain path sends it or, with "auto", as
  // far as no call may have begun, and the calls whole at the end.
  std::vector<Json> ReasoningChunks(int index, const tinyserve::v1::GenerateResponse& response);
  // Streamed "auto" output's end: the calls (if any), whole, then the finish reason.
  void AppendCallsAndFinish(int index, const Choice& choice, std::vector<Json>* out) const;
  // The tool call an output makes, or null when it is not one (cut short by max_tokens).
  Json ToolCall(const std::string& text) const;
  // tool_choice "auto": the output's calls in the request's format (vLLM's hermes and
  // llama3_json parsers), null when it has none or one does not parse as a call of a known
  // function; *content is the text before the first call.
  Json AutoToolCalls(const std::string& text, std::string* content) const;
  // Streamed "auto" output: how many bytes of `text` may go out as content now (the rest may
  // still turn out to be a call).
  size_t AutoContentLimit(const std::string& text, size_t sent) const;
  Json ChunkObject(Json choices) const;
  Json ChoiceDelta(int index, const std::string& text, const Json& logprobs,
                   const std::string& finish_reason, bool first) const;
  void AddLogprobs(Choice& choice, const tinyserve::v1::Chunk& chunk, Json* delta);
  // A chunk's prompt logprobs into choice.prompt_logprobs (vLLM's form).
  void AddPromptLogprobs(Choice& choice, const tinyserve::v1::Chunk& chunk);

  const ParsedRequest& request_;
  std::string id_;
  int64_t created_;
  std::vector<Choice> choices_;
};

}  // namespace tinyserve::openai
