// libFuzzer target for the HTTP API's request parsers and response builders (openai_api.h,
// openai_responses.h, anthropic_api.h): any body must give a request or an INVALID_ARGUMENT, never
// a crash; a parsed request's responses must build (the body is also the output text, so
// tool_choice "auto"'s call parsing sees it, with the hermes parser and the llama3_json one). Built
// with -DTINYSERVE_FUZZ=ON (clang).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "worker/server/anthropic_api.h"
#include "worker/server/openai_api.h"
#include "worker/server/openai_responses.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace oa = tinyserve::openai;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const oa::ServedModel hermes{"m", 2048, {"lora-a"}, "hermes"};
  const oa::ServedModel llama3{"m", 2048, {"lora-a"}, "llama3_json"};
  for (oa::Endpoint e : {oa::Endpoint::kCompletions, oa::Endpoint::kChat, oa::Endpoint::kChat,
                         oa::Endpoint::kResponses, oa::Endpoint::kMessages}) {
    const oa::ServedModel& model = e == oa::Endpoint::kCompletions || size % 2 ? hermes : llama3;
    absl::StatusOr<oa::ParsedRequest> r;
    if (e == oa::Endpoint::kResponses) {
      r = oa::ParseResponsesRequest(body, model, "fuzz");
    } else if (e == oa::Endpoint::kMessages) {
      r = oa::ParseMessagesRequest(body, model, "fuzz");
    } else {
      r = oa::ParseRequest(e, body, model, "fuzz");
    }
    if (!r.ok()) {
      // A "model" that is neither "m" nor an adapter is NOT_FOUND (404).
      if (r.status().code() != absl::StatusCode::kInvalidArgument &&
          r.status().code() != absl::StatusCode::kNotFound)
        __builtin_trap();
      oa::ErrorBody(r.status());
      oa::AnthropicErrorBody(r.status());
      continue;
    }
    std::unique_ptr<oa::AnswerBuilder> b;
    if (e == oa::Endpoint::kResponses) {
      b = std::make_unique<oa::ResponsesBuilder>(*r, "resp_id", 0);
    } else if (e == oa::Endpoint::kMessages) {
      b = std::make_unique<oa::MessagesBuilder>(*r, "msg_id");
    } else {
      b = std::make_unique<oa::ResponseBuilder>(*r, "id", 0);
    }
    tinyserve::v1::GenerateResponse chunk;
    chunk.mutable_chunk()->add_token_ids(1);
    chunk.mutable_chunk()->set_text(std::string(body));
    chunk.mutable_chunk()->add_logprobs()->set_text("\xff");
    tinyserve::v1::GenerateResponse done;
    if (size % 3 == 0) {  // a stop string ended it (vLLM's stop_reason, Anthropic's stop_sequence)
      done.mutable_complete()->set_finish_reason(tinyserve::v1::FINISH_REASON_STOP_STRING);
      done.mutable_complete()->set_stop_string(std::string(body.substr(0, 8)));
    } else {
      done.mutable_complete()->set_finish_reason(tinyserve::v1::FINISH_REASON_EOS);
    }
    for (size_t i = 0; i < r->calls.size(); ++i) {
      b->OnResponse(static_cast<int>(i), chunk);
      b->OnResponse(static_cast<int>(i), done);
    }
    if (r->stream) {
      b->StreamEnd();
    } else {
      b->Body();
    }
  }
  return 0;
}
