// File: worker/server/openai_responses.h
// OpenAI's Responses API (POST /v1/responses), served as vLLM serves it: on top of chat
// completions. A body is translated into a chat request (input items into messages,
// instructions into a leading system message, flat function tools into chat tools,
// text.format into response_format, max_output_tokens into max_completion_tokens), checked by
// the chat parser, and the chat answer is turned back into a response object, or into the
// Responses API's typed server-sent events when streamed. With a ResponseStore, responses are
// kept (store, default true) and previous_response_id continues one: its conversation's items
// (response_store.h) come before this request's input, and its instructions are not carried
// over (OpenAI's rule).
//
// Request fields: model, input (a string, or a list of items: messages {"role", "content"}
// with roles user, system, developer or assistant and content a string or a list of
// input_text / output_text parts; function_call and function_call_output items of earlier
// turns; reasoning items are dropped), instructions, max_output_tokens, temperature, top_p,
// stream, text.format (text, json_object, json_schema), tools (function tools), tool_choice
// ("none", "auto", "required", {"type": "function", "name"}), parallel_tool_calls and
// max_tool_calls (the calls answered are cut to one, or to the maximum), top_logprobs and
// include "message.output_text.logprobs", metadata (echoed), store (false in the response
// when there is no store to keep it in), previous_response_id, user, safety_identifier,
// prompt_cache_key, service_tier, stream_options (ignored); vLLM's sampling extras as in chat
// (seed, top_k, min_p, stop, selection, priority, cache_salt, structured_outputs, ...). Refused
// unless neutral: conversation (the Conversations API is not served), background, prompt,
// truncation "auto", item_reference items, and input parts or tools other than text and
// functions; previous_response_id without a store. reasoning.effort is chat's
// reasoning_effort (a chat template variable).
//
// Errors name the Responses field ("input[1].content[0]", "tools[0].parameters",
// "max_output_tokens"), as the chat parser's name the chat field.
//
// Thread safety: the parser is pure; a ResponsesBuilder belongs to one HTTP request.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "worker/server/openai_api.h"
#include "worker/server/response_store.h"

namespace tinyserve::openai {

// Parses and checks a /v1/responses body into one chat call (endpoint kResponses; the echoed
// request fields in ParsedRequest::responses). `store`: where previous_response_id is looked
// up (null: responses are not kept, previous_response_id is refused, "store" is false).
absl::StatusOr<ParsedRequest> ParseResponsesRequest(std::string_view body, const ServedModel& model,
                                                    const std::string& request_id,
                                                    ResponseStore* store = nullptr);

// The answer: a response object {"object": "response", "output": [message and function_call
// items], "usage": {"input_tokens", ...}}, or, streamed, events "event: TYPE\ndata: {...}\n\n":
// response.created, response.in_progress, then per item output_item.added, its content part
// or arguments as deltas and their done events, output_item.done, and last
// response.completed (response.incomplete when max_output_tokens cut it, response.failed
// after an "error" event). No "[DONE]" (OpenAI sends none on this route).
class ResponsesBuilder final : public AnswerBuilder {
 public:
  // `request` from ParseResponsesRequest; `id` the response's ("resp_..."); item_suffix ends
  // the output items' ids ("msg_SUFFIX"; empty: the id's part after "resp_"), which must not
  // give away a stored response's id.
  ResponsesBuilder(const ParsedRequest& request, std::string id, int64_t created,
                   std::string item_suffix = "");

  std::string OnResponse(int index, const tinyserve::v1::GenerateResponse& response) override;
  std::string OnFailure(int index, const grpc::Status& status) override;
  std::string StreamEnd() override;
  std::string Body() const override;
  // The response object Body() or StreamEnd() returned last (null before): what the store
  // keeps.
  const Json& Final() const { return final_; }

 private:
  // The response object with the given status, the chat finish_reason and output (usage
  // once completed).
  Json ResponseObject(const std::string& status, const std::string& finish, Json output,
                      const Json& usage, const Json& stats) const;
  // Appends "event: TYPE\ndata: {"type": TYPE, "sequence_number": n, ...fields}\n\n" to the
  // events to send; Flush() takes them.
  void Emit(const std::string& type, Json fields);
  std::string Flush();
  void Start();                    // response.created and response.in_progress, once
  void OpenMessage();              // output_item.added and content_part.added
  void CloseMessage();             // the done events of the open message item
  void AddCall(const Json& call);  // a whole function_call item
  // The function_call item of a chat tool call.
  Json CallItem(const Json& call, const std::string& status) const;
  std::string MessageId() const;
  std::string ReasoningId() const;
  // The message item holding `text`.
  Json MessageItem(const std::string& text, const Json& logprobs, const std::string& status) const;
  // With --reasoning-parser: the reasoning item holding a <think> block's text (vLLM's form:
  // content [{"type": "reasoning_text", "text"}], an empty summary).
  Json ReasoningItem(const std::string& text, const std::string& status) const;
  void CloseReasoning();  // streamed: the done events of the open reasoning item
  size_t MaxCalls() const;

  ParsedRequest chat_request_;  // the request as chat (endpoint kChat)
  ResponseBuilder chat_;
  std::string id_;
  std::string item_suffix_;
  int64_t created_;
  // Streamed state.
  std::string pending_;  // events not yet returned
  int sequence_ = 0;
  bool started_ = false;
  bool message_open_ = false;
  bool reasoning_open_ = false;
  std::string reasoning_;               // the open reasoning item's text
  std::string text_;                    // the open message's text
  Json text_logprobs_ = Json::array();  // and its logprobs
  Json output_ = Json::array();         // finished items
  size_t calls_ = 0;
  std::string finish_;  // the chat finish_reason
  std::optional<grpc::Status> failure_;
  mutable Json final_;  // Final()
};

}  // namespace tinyserve::openai
