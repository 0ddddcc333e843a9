// libFuzzer target for the OpenAI-compatible request parsers and response builders
// (openai_api.h, openai_responses.h): any body must give a request or an INVALID_ARGUMENT, never a
// crash; a parsed request's responses must build (the body is also the output text, so tool_choice
// "auto"'s call parsing sees it, with the hermes parser and the llama3_json one). Built with
// -DTINYSERVE_FUZZ=ON (clang).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "worker/server/openai_api.h"
#include "worker/server/openai_responses.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace oa = tinyserve::openai;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const oa::ServedModel hermes{"m", 2048, {"lora-a"}, "hermes"};
  const oa::ServedModel llama3{"m", 2048, {"lora-a"}, "llama3_json"};
  for (oa::Endpoint e : {oa::Endpoint::kCompletions, oa::Endpoint::kChat, oa::Endpoint::kChat,
                         oa::Endpoint::kResponses}) {
    const oa::ServedModel& model = e == oa::Endpoint::kCompletions || size % 2 ? hermes : llama3;
    const bool responses = e == oa::Endpoint::kResponses;
    auto r = responses ? oa::ParseResponsesRequest(body, model, "fuzz")
                       : oa::ParseRequest(e, body, model, "fuzz");
    if (!r.ok()) {
      // A "model" that is neither "m" nor an adapter is NOT_FOUND (404).
      if (r.status().code() != absl::StatusCode::kInvalidArgument &&
          r.status().code() != absl::StatusCode::kNotFound)
        __builtin_trap();
      oa::ErrorBody(r.status());
      continue;
    }
    std::unique_ptr<oa::AnswerBuilder> b;
    if (responses) {
      b = std::make_unique<oa::ResponsesBuilder>(*r, "resp_id", 0);
    } else {
      b = std::make_unique<oa::ResponseBuilder>(*r, "id", 0);
    }
    tinyserve::v1::GenerateResponse chunk;
    chunk.mutable_chunk()->add_token_ids(1);
    chunk.mutable_chunk()->set_text(std::string(body));
    chunk.mutable_chunk()->add_logprobs()->set_text("\xff");
    tinyserve::v1::GenerateResponse done;
    done.mutable_complete()->set_finish_reason(tinyserve::v1::FINISH_REASON_EOS);
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
