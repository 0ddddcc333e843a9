#include "worker/server/proto_convert.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "worker/server/block_hash.h"

namespace tinyserve {
namespace {

namespace v1 = tinyserve::v1;

constexpr int kDefaultMaxTokens = 128;

absl::Status CheckIds(const google::protobuf::RepeatedField<int32_t>& ids, int vocab,
                      const char* field) {
  for (int i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "] = ", ids[i],
                                                     " is outside the vocabulary [0, ", vocab,
                                                     ")"));
    }
  }
  return absl::OkStatus();
}

SamplingParams ToSampling(const v1::SamplingOptions& s) {
  SamplingParams p;
  p.temperature = s.temperature();
  p.top_k = s.top_k();
  p.top_p = s.top_p() == 0.0f ? 1.0f : s.top_p();
  p.min_p = s.min_p();
  p.repetition_penalty = s.repetition_penalty() == 0.0f ? 1.0f : s.repetition_penalty();
  p.presence_penalty = s.presence_penalty();
  p.frequency_penalty = s.frequency_penalty();
  p.min_tokens = s.min_tokens();
  p.response_format = s.response_format();
  p.json_schema = s.json_schema();
  p.regex = s.regex();
  p.grammar = s.grammar();
  for (const auto& [id, bias] : s.logit_bias()) p.logit_bias.push_back({id, bias});
  std::sort(p.logit_bias.begin(), p.logit_bias.end());  // map order is unspecified
  p.has_seed = s.has_seed();
  p.seed = s.seed();
  p.max_tokens = s.max_tokens() == 0 ? kDefaultMaxTokens : s.max_tokens();
  p.stop.assign(s.stop().begin(), s.stop().end());
  p.stop_token_ids.assign(s.stop_token_ids().begin(), s.stop_token_ids().end());
  p.ignore_eos = s.ignore_eos();
  p.skip_special_tokens = !s.has_skip_special_tokens() || s.skip_special_tokens();
  if (s.has_thinking_token_budget()) p.thinking_token_budget = s.thinking_token_budget();
  p.reasoning_format = s.reasoning_format();
  p.logprobs = s.has_logprobs() ? s.logprobs() : -1;
  p.prompt_logprobs = s.has_prompt_logprobs() ? s.prompt_logprobs() : -1;
  return p;
}

// The id of adapter `name` (0: the base model, for an empty name).
absl::StatusOr<int> ResolveLora(const std::string& name, const std::vector<LoraInfo>& loras) {
  if (name.empty()) return 0;
  if (const int id = LoraId(loras, name); id != 0) return id;
  std::vector<std::string> names;
  for (const LoraInfo& l : loras)
    if (!l.name.empty()) names.push_back(l.name);
  return absl::InvalidArgumentError(
      absl::StrCat("lora_adapter: no adapter named '", name.substr(0, 80),
                   "' (loaded: ", names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
}

// A caller's request_id: ids beginning with "__" name the server's own requests (health probes,
// an Embed call's inputs), so a caller can neither take their place nor abort them by name.
absl::Status CheckRequestId(const std::string& id) {
  if (id.size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id: at most ", kMaxRequestIdBytes, " bytes, got ", id.size()));
  }
  if (id.rfind("__", 0) == 0) {
    return absl::InvalidArgumentError(
        "request_id: ids beginning with \"__\" are reserved for the server's own requests");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<GenerateRequest>> ToEngineEmbedRequests(
    const v1::EmbedRequest& request, const Tokenizer& tokenizer,
    const std::vector<LoraInfo>& loras) {
  TS_RETURN_IF_ERROR(CheckRequestId(request.request_id()));
  if (request.inputs().empty()) return absl::InvalidArgumentError("inputs: no input given");
  if (request.inputs_size() > kMaxEmbedInputs)
    return absl::InvalidArgumentError(
        absl::StrCat("inputs: ", request.inputs_size(), " inputs; at most ", kMaxEmbedInputs));
  GenerateRequest base;
  TS_ASSIGN_OR_RETURN(base.lora, ResolveLora(request.lora_adapter(), loras));
  base.cache_salt = CacheSaltSeed(request.cache_salt());
  base.priority = request.priority();
  base.pooling = request.pooling() == v1::POOLING_MEAN ? Pooling::kMean : Pooling::kLast;
  if (request.pooling() != v1::POOLING_UNSPECIFIED && request.pooling() != v1::POOLING_LAST &&
      request.pooling() != v1::POOLING_MEAN)
    return absl::InvalidArgumentError(
        absl::StrCat("pooling: unknown value ", static_cast<int>(request.pooling())));
  const bool add_bos = request.has_add_special_tokens() ? request.add_special_tokens() : true;
  std::vector<GenerateRequest> out;
  for (int i = 0; i < request.inputs_size(); ++i) {
    const v1::EmbedInput& in = request.inputs(i);
    GenerateRequest r = base;
    const std::string field = absl::StrCat("inputs[", i, "]");
    if (in.input_case() == v1::EmbedInput::kText) {
      r.prompt_ids = tokenizer.Encode(in.text(), request.parse_special_tokens(), add_bos);
    } else if (in.input_case() == v1::EmbedInput::kTokenIds) {
      const std::string ids_field = field + ".token_ids.ids";
      TS_RETURN_IF_ERROR(CheckIds(in.token_ids().ids(), tokenizer.vocab_size(), ids_field.c_str()));
      r.prompt_ids.assign(in.token_ids().ids().begin(), in.token_ids().ids().end());
    }
    if (r.prompt_ids.empty())
      return absl::InvalidArgumentError(absl::StrCat(field, ": empty (no tokens to embed)"));
    out.push_back(std::move(r));
  }
  return out;
}

absl::StatusOr<std::vector<int32_t>> EncodeChat(const v1::ChatMessages& chat,
                                                const Tokenizer& tokenizer) {
  const auto& messages = chat.messages();
  if (messages.empty()) return absl::InvalidArgumentError("chat.messages: prompt is empty");
  std::vector<ChatMessage> list;
  for (int i = 0; i < messages.size(); ++i) {
    if (messages[i].role().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("chat.messages[", i, "].role is empty"));
    }
    list.push_back({messages[i].role(), messages[i].content(), messages[i].tool_calls_json(),
                    messages[i].tool_call_id(), messages[i].reasoning_content()});
  }
  const bool continue_final = chat.continue_final_message();
  if (absl::Status s = CheckTemplateKwargs(chat.template_kwargs_json()); !s.ok())
    return absl::InvalidArgumentError(absl::StrCat("chat.template_kwargs_json: ", s.message()));
  absl::StatusOr<std::string> rendered =
      RenderChat(tokenizer.data(), list,
                 chat.has_add_generation_prompt() ? chat.add_generation_prompt() : !continue_final,
                 chat.tools_json(), continue_final, chat.template_kwargs_json());
  if (!rendered.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("chat.messages: ", rendered.status().message()));
  }
  return tokenizer.Encode(*rendered, /*parse_special=*/true, /*add_bos=*/false);
}

absl::StatusOr<GenerateRequest> ToEngineRequest(const v1::GenerateRequest& request,
                                                const Tokenizer& tokenizer,
                                                const SelectionSpec& default_selection,
                                                const std::vector<LoraInfo>& loras) {
  TS_RETURN_IF_ERROR(CheckRequestId(request.request_id()));
  GenerateRequest out;
  const int vocab = tokenizer.vocab_size();
  switch (request.prompt_case()) {
    case v1::GenerateRequest::kText: {
      if (request.text().empty()) return absl::InvalidArgumentError("text: prompt is empty");
      const bool add_bos =
          request.has_add_special_tokens() ? request.add_special_tokens() : true;
      out.prompt_ids = tokenizer.Encode(request.text(), request.parse_special_tokens(), add_bos);
      break;
    }
    case v1::GenerateRequest::kTokenIds: {
      const auto& ids = request.token_ids().ids();
      if (ids.empty()) return absl::InvalidArgumentError("token_ids: prompt is empty");
      if (auto s = CheckIds(ids, vocab, "token_ids.ids"); !s.ok()) return s;
      out.prompt_ids.assign(ids.begin(), ids.end());
      break;
    }
    case v1::GenerateRequest::kChat: {
      TS_ASSIGN_OR_RETURN(out.prompt_ids, EncodeChat(request.chat(), tokenizer));
      break;
    }
    default:
      return absl::InvalidArgumentError(
          "prompt: one of text, token_ids or chat must be set (prompt is empty)");
  }
  if (out.prompt_ids.empty()) {
    return absl::InvalidArgumentError("prompt: tokenizes to no tokens (prompt is empty)");
  }

  out.sampling = ToSampling(request.sampling());
  out.cache_salt = CacheSaltSeed(request.cache_salt());
  TS_ASSIGN_OR_RETURN(out.lora, ResolveLora(request.lora_adapter(), loras));
  out.priority = request.priority();
  out.continuation_ids.assign(request.continuation_ids().begin(), request.continuation_ids().end());
  if (auto s = CheckIds(request.sampling().stop_token_ids(), vocab, "sampling.stop_token_ids");
      !s.ok()) {
    return s;
  }

  if (request.has_selection()) {
    const v1::SelectionOptions& sel = request.selection();
    SelectionSpec spec = default_selection;
    if (!sel.policy().empty()) spec.policy = sel.policy();
    if (sel.budget() != 0) spec.budget = sel.budget();
    if (sel.has_dense_layers()) spec.dense_layers = sel.dense_layers();
    if (sel.has_sink_pages()) spec.sink_pages = sel.sink_pages();
    if (sel.has_recent_pages()) spec.recent_pages = sel.recent_pages();
    if (sel.has_oracle_every()) spec.oracle_every = sel.oracle_every();
    for (const auto& [k, v] : sel.params()) spec.params[k] = v;
    out.selection = std::move(spec);
  }
  return out;
}

v1::FinishReason ToProtoFinishReason(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength: return v1::FINISH_REASON_LENGTH;
    case FinishReason::kEos: return v1::FINISH_REASON_EOS;
    case FinishReason::kStopToken: return v1::FINISH_REASON_STOP_TOKEN;
    case FinishReason::kStopString: return v1::FINISH_REASON_STOP_STRING;
    case FinishReason::kAbort: return v1::FINISH_REASON_ABORT;
    case FinishReason::kDeadline: return v1::FINISH_REASON_DEADLINE;
    case FinishReason::kError: return v1::FINISH_REASON_ERROR;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

void FillComplete(const RequestUsage& usage, FinishReason reason, v1::Complete* complete) {
  complete->set_finish_reason(ToProtoFinishReason(reason));
  if (reason == FinishReason::kStopString) complete->set_stop_string(usage.stop_string);
  if (reason == FinishReason::kStopToken) complete->set_stop_token_id(usage.stop_token_id);
  v1::Usage* u = complete->mutable_usage();
  u->set_prompt_tokens(usage.prompt_tokens);
  u->set_completion_tokens(usage.generated_tokens);
  u->set_cached_tokens(usage.cached_tokens);
  u->set_preemptions(usage.preemptions);
  u->set_spec_draft_tokens(usage.spec_draft_tokens);
  u->set_spec_accepted_tokens(usage.spec_accepted_tokens);
  v1::Timing* t = complete->mutable_timing();
  t->set_queue_seconds(usage.queue_seconds);
  t->set_ttft_seconds(usage.ttft_seconds);
  t->set_prefill_seconds(usage.prefill_seconds);
  t->set_decode_seconds(usage.decode_seconds);
  t->set_e2e_seconds(usage.e2e_seconds);
  const SelectionSummary& s = usage.selection;
  v1::SelectionStats* sel = complete->mutable_selection();
  sel->set_policy(s.policy);
  sel->set_steps(s.steps);
  sel->set_pages_scored(s.pages_scored);
  sel->set_pages_selected(s.pages_selected);
  sel->set_kv_bytes_read(s.kv_bytes_read);
  sel->set_kv_bytes_dense(s.kv_bytes_dense);
  sel->set_page_hit_rate(s.page_hit_rate);
  sel->set_mass_recall(s.mass_recall);
  sel->set_reuse(s.reuse);
  sel->set_select_seconds(s.select_seconds);
  sel->set_attention_seconds(s.attention_seconds);
}

}  // namespace tinyserve
