// File: worker/server/proto_convert.h
// Public API messages <-> engine types. Parsing happens on the RPC thread, as early as possible
// ("parse into native types early"): the prompt is tokenized here, so the engine only sees ids.
// Errors are InvalidArgument naming the field; range checks the engine does itself (sampling
// values, prompt length vs context, policy names) are left to Engine::Submit.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tinyserve/v1/tinyserve.pb.h"
#include "worker/engine/engine.h"

namespace tinyserve {

// Builds the engine request (prompt tokenized, defaults applied; request_id and deadline are
// left to the caller). default_selection: the server's policy, which set fields override.
// loras: the loaded adapters, which lora_adapter names.
// A conversation's prompt tokens: the model's chat template's rendering, tokenized with special
// tokens parsed and no BOS added (the template writes its own). INVALID_ARGUMENT naming
// "chat.messages" when it is empty or the template refuses it.
absl::StatusOr<std::vector<int32_t>> EncodeChat(const tinyserve::v1::ChatMessages& chat,
                                                const Tokenizer& tokenizer);

absl::StatusOr<GenerateRequest> ToEngineRequest(const tinyserve::v1::GenerateRequest& request,
                                                const Tokenizer& tokenizer,
                                                const SelectionSpec& default_selection,
                                                const std::vector<LoraInfo>& loras);

// Embed: one engine request per input (tokenized, pooling set; request_id and deadline are
// left to the caller). Errors name the field ("inputs[3]: empty ...").
inline constexpr int kMaxEmbedInputs = 2048;  // OpenAI's limit per call
inline constexpr size_t kMaxRequestIdBytes = 256;
absl::StatusOr<std::vector<GenerateRequest>> ToEngineEmbedRequests(
    const tinyserve::v1::EmbedRequest& request, const Tokenizer& tokenizer,
    const std::vector<LoraInfo>& loras);

tinyserve::v1::FinishReason ToProtoFinishReason(FinishReason reason);
// Fills Complete.usage, timing and selection from the engine's usage.
void FillComplete(const RequestUsage& usage, FinishReason reason,
                  tinyserve::v1::Complete* complete);

}  // namespace tinyserve
