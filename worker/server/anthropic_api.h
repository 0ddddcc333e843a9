// File: worker/server/anthropic_api.h
// Anthropic's Messages API (POST /v1/messages), served as llama.cpp's server and vLLM serve it
// for clients written against it (the `anthropic` SDKs, agents): translated into a chat request
// and the chat answer back, as openai_responses.h does for OpenAI's Responses API.
//
// Request fields: model, max_tokens (required), messages (roles user and assistant; content a
// string or a list of blocks: text, tool_use in assistant turns, tool_result in user turns;
// thinking blocks are dropped), system (a string or text blocks), stop_sequences, temperature,
// top_p, top_k, stream, tools ({"name", "description", "input_schema"}), tool_choice ({"type":
// "auto" | "any" | "tool" | "none"}, "name", "disable_parallel_tool_use"), output_config.format
// ({"type": "json_schema", "schema"}: structured output), metadata (ignored);
// vLLM's sampling extras as in chat (seed, min_p, penalties, selection, priority, ...).
// Refused naming the field: image and document blocks, server tools (a "type" other than
// custom), thinking enabled and output_config.effort (the model does not reason).
//
// Errors are Anthropic's shape, {"type": "error", "error": {"type": "invalid_request_error",
// "message": "..."}}, the message starting with the field (Anthropic's names).
//
// Thread safety: the parser is pure; a MessagesBuilder belongs to one HTTP request.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"
#include "worker/server/openai_api.h"

namespace tinyserve::openai {

// Parses and checks a /v1/messages body into one chat call (endpoint kMessages; what the
// builder needs in ParsedRequest::responses). count_only: a /v1/messages/count_tokens body,
// which has no max_tokens.
absl::StatusOr<ParsedRequest> ParseMessagesRequest(std::string_view body, const ServedModel& model,
                                                   const std::string& request_id,
                                                   bool count_only = false);

// Anthropic's error object for a status.
Json AnthropicErrorBody(const absl::Status& status);

// The answer: a message object {"type": "message", "content": [text and tool_use blocks],
// "stop_reason": "end_turn" | "max_tokens" | "stop_sequence" | "tool_use", "stop_sequence",
// "usage"}, or, streamed, events "event: TYPE\ndata: {...}\n\n": message_start, per block
// content_block_start, its deltas (text_delta, input_json_delta) and content_block_stop, then
// message_delta (stop reason, usage) and message_stop; a failure mid-stream is an "error"
// event.
class MessagesBuilder final : public AnswerBuilder {
 public:
  // `request` from ParseMessagesRequest; `id` the message's ("msg_...").
  MessagesBuilder(const ParsedRequest& request, std::string id);

  std::string OnResponse(int index, const tinyserve::v1::GenerateResponse& response) override;
  std::string OnFailure(int index, const grpc::Status& status) override;
  std::string StreamEnd() override;
  std::string Body() const override;

 private:
  void Emit(const std::string& type, Json fields);  // appends an event to pending_
  std::string Flush();
  void Start();                          // message_start, once
  void CloseBlock();                     // content_block_stop of an open text block
  void AddToolUse(const Json& call);     // a whole tool_use block
  Json ToolUse(const Json& call) const;  // the tool_use block of a chat tool call
  Json Usage(const Json& chat_usage) const;
  // stop_reason and stop_sequence of a chat finish_reason and the chat choice's stop_reason
  // (vLLM's: the stop string that ended it, or null).
  std::pair<std::string, Json> StopReason(const std::string& finish, const Json& stop) const;
  size_t MaxCalls() const;

  ParsedRequest chat_request_;  // the request as chat (endpoint kChat)
  ResponseBuilder chat_;
  std::string id_;
  std::string pending_;
  bool started_ = false;
  int blocks_ = 0;          // content blocks started
  bool text_open_ = false;  // the last block is text (or thinking) and not yet stopped
  bool thinking_open_ = false;  // that block is a thinking block
  size_t calls_ = 0;
  std::string finish_;
  Json stop_reason_ = nullptr;  // the chat builder's stop_reason of the finished choice
  std::optional<grpc::Status> failure_;
};

}  // namespace tinyserve::openai
