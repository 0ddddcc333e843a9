#include "worker/server/openai_api.h"

#include <algorithm>
#include <cctype>
#include <iterator>
#include <limits>
#include <random>
#include <set>

#include "absl/strings/cord.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json_nesting.h"
#include "common/status.h"
#include "google/protobuf/util/json_util.h"
#include "worker/sampling/grammar.h"
#include "worker/sampling/json_constraint.h"
#include "worker/sampling/json_schema.h"
#include "worker/sampling/regex.h"
#include "worker/server/api_util.h"
#include "worker/server/openai_fields.h"

namespace tinyserve::openai {
namespace {

using json = nlohmann::ordered_json;
namespace v1 = tinyserve::v1;

constexpr int kMaxChoices = 64;
constexpr int kCompletionsDefaultMaxTokens = 16;  // OpenAI's default for /v1/completions

// A prompt of /v1/completions: text or token ids.
struct Prompt {
  std::string text;
  std::vector<int32_t> ids;
  bool is_text = true;
};

bool IsTokenList(const json& v) {
  if (!v.is_array() || v.empty()) return false;
  for (const json& x : v) {
    if (!x.is_number_integer()) return false;
  }
  return true;
}

// The prompts of field `key` (completions' "prompt", embeddings' "input").
absl::Status ParsePrompts(Fields& f, const std::string& key, std::vector<Prompt>* out) {
  const json* p = f.Get(key.c_str());
  if (p == nullptr) return Bad(key, "is required");
  auto token_prompt = [](const json& v, absl::string_view field) -> absl::StatusOr<Prompt> {
    Prompt prompt;
    prompt.is_text = false;
    for (const json& x : v) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 ||
          x.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return Bad(field, "token ids must be integers in [0, 2^31)");
      }
      prompt.ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
    }
    return prompt;
  };
  if (p->is_string()) {
    out->push_back({p->get<std::string>(), {}, true});
  } else if (IsTokenList(*p)) {
    auto one = token_prompt(*p, key);
    if (!one.ok()) return one.status();
    out->push_back(*std::move(one));
  } else if (p->is_array() && !p->empty()) {
    for (size_t i = 0; i < p->size(); ++i) {
      const json& e = (*p)[i];
      const std::string field = absl::StrCat(key, "[", i, "]");
      if (e.is_string()) {
        out->push_back({e.get<std::string>(), {}, true});
      } else if (IsTokenList(e)) {
        auto one = token_prompt(e, field);
        if (!one.ok()) return one.status();
        out->push_back(*std::move(one));
      } else {
        return Bad(field, "must be a string or a non-empty list of token ids");
      }
    }
  } else {
    return Bad(key, "must be a string, a list of token ids, or a non-empty list of either");
  }
  for (size_t i = 0; i < out->size(); ++i) {
    if ((*out)[i].is_text && (*out)[i].text.empty()) {
      return Bad(out->size() == 1 ? key : absl::StrCat(key, "[", i, "]"), "is empty");
    }
  }
  return absl::OkStatus();
}

// "model": a LoRA adapter's name sets *adapter; the base model's, or any name when no adapter
// is loaded, leaves it empty; another name is a 404 (vLLM's "model does not exist").
absl::Status ResolveAdapter(Fields& f, const ServedModel& model, std::string* adapter) {
  const auto name = f.String("model");
  if (!name || model.loras.empty() || *name == model.name) return absl::OkStatus();
  if (std::find(model.loras.begin(), model.loras.end(), *name) == model.loras.end()) {
    absl::Status st = absl::NotFoundError(
        absl::StrCat("The model `", name->substr(0, 80), "` does not exist (served: ", model.name,
                     ", ", absl::StrJoin(model.loras, ", "), ")."));
    st.SetPayload(kParamPayload, absl::Cord("model"));
    return st;
  }
  *adapter = *name;
  return absl::OkStatus();
}

absl::Status ParseMessages(Fields& f, v1::ChatMessages* out) {
  const json* m = f.Get("messages");
  if (m == nullptr) return Bad("messages", "is required");
  if (!m->is_array() || m->empty()) return Bad("messages", "must be a non-empty list");
  for (size_t i = 0; i < m->size(); ++i) {
    const json& msg = (*m)[i];
    const std::string at = absl::StrCat("messages[", i, "]");
    if (!msg.is_object()) return Bad(at, "must be an object");
    Fields mf(msg, at + ".");
    std::string role = mf.String("role").value_or("");
    TS_RETURN_IF_ERROR(mf.status());
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      return Bad(at + ".role", "must be system, developer, user, assistant or tool");
    }
    std::string tool_calls;
    if (const json* calls = mf.Get("tool_calls"); calls != nullptr && !calls->empty()) {
      if (role != "assistant") return Bad(at + ".tool_calls", "only assistant turns make calls");
      if (!calls->is_array()) return Bad(at + ".tool_calls", "must be a list");
      for (size_t k = 0; k < calls->size(); ++k) {
        const json& call = (*calls)[k];
        const std::string cat = absl::StrCat(at, ".tool_calls[", k, "]");
        const json* fn =
            call.is_object() && call.contains("function") ? &call["function"] : nullptr;
        if (fn == nullptr || !fn->is_object() || !fn->contains("name") ||
            !(*fn)["name"].is_string()) {
          return Bad(cat + ".function.name", "is required");
        }
        if (fn->contains("arguments") && !(*fn)["arguments"].is_string()) {
          return Bad(cat + ".function.arguments", "must be a string (JSON text)");
        }
      }
      tool_calls = calls->dump();
    }
    std::string tool_call_id;
    if (role == "tool") {
      tool_call_id = mf.String("tool_call_id").value_or("");
      TS_RETURN_IF_ERROR(mf.status());
      if (tool_call_id.empty()) return Bad(at + ".tool_call_id", "is required for a tool turn");
    }
    std::string content;
    if (const json* c = mf.Get("content"); c == nullptr) {
      if (tool_calls.empty()) return Bad(at + ".content", "is required");
    } else if (c->is_string()) {
      content = c->get<std::string>();
    } else if (c->is_array()) {
      std::vector<std::string> parts;
      for (size_t k = 0; k < c->size(); ++k) {
        const json& part = (*c)[k];
        const std::string pat = absl::StrCat(at, ".content[", k, "]");
        if (!part.is_object() || StringField(part, "type") != "text") {
          return Bad(pat, "only {\"type\": \"text\"} parts are supported");
        }
        auto text = part.find("text");
        if (text == part.end() || !text->is_string()) return Bad(pat + ".text", "must be a string");
        parts.push_back(text->get<std::string>());
      }
      content = absl::StrJoin(parts, "\n");
    } else {
      return Bad(at + ".content", "must be a string or a list of text parts");
    }
    // vLLM's: an assistant turn's reasoning ("reasoning_content", or "reasoning"), which
    // thinking models' templates (Qwen3's) place in the prompt.
    std::string reasoning = mf.String("reasoning_content").value_or("");
    if (reasoning.empty()) reasoning = mf.String("reasoning").value_or("");
    TS_RETURN_IF_ERROR(mf.status());
    if (!reasoning.empty() && role != "assistant")
      return Bad(at + ".reasoning_content", "only assistant turns carry reasoning");
    v1::ChatMessage* out_msg = out->add_messages();
    out_msg->set_role(role);
    out_msg->set_content(std::move(content));
    out_msg->set_tool_calls_json(std::move(tool_calls));
    out_msg->set_tool_call_id(std::move(tool_call_id));
    out_msg->set_reasoning_content(std::move(reasoning));
  }
  return absl::OkStatus();
}

// Moves a tool's parameter schema to $defs/<key> of a larger schema: its local references
// ("#/...", "#") are rebased below it.
void Rebase(json* schema, const std::string& key) {
  if (schema->is_object()) {
    for (auto& [k, v] : schema->items()) {
      if (k == "$ref" && v.is_string() && v.get<std::string>().rfind('#', 0) == 0) {
        v = absl::StrCat("#/$defs/", key, v.get<std::string>().substr(1));
      } else {
        Rebase(&v, key);
      }
    }
  } else if (schema->is_array()) {
    for (json& v : *schema) Rebase(&v, key);
  }
}

bool ValidFunctionName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  }
  return true;
}

// tools and tool_choice: the tools go to the chat template, and a forced choice becomes a JSON
// schema the output is held to (OpenAI's and vLLM's named and "required" tool choice).
absl::Status ParseTools(Fields& f, const ServedModel& model, v1::GenerateRequest* r,
                        ParsedRequest* out) {
  const json* tools = f.Get("tools");
  const json* choice = f.Get("tool_choice");
  if (tools == nullptr || (tools->is_array() && tools->empty())) {
    if (choice != nullptr && *choice != "none" && *choice != "auto") {
      return Bad("tool_choice", "needs tools");
    }
    return absl::OkStatus();
  }
  if (!tools->is_array() || tools->size() > 128) return Bad("tools", "must be a list of 1 to 128");
  json list = json::array();
  std::vector<std::pair<std::string, json>> functions;  // name, parameter schema
  std::set<std::string> names;
  for (size_t i = 0; i < tools->size(); ++i) {
    const json& tool = (*tools)[i];
    const std::string at = absl::StrCat("tools[", i, "]");
    if (!tool.is_object() || StringField(tool, "type") != "function") {
      return Bad(at + ".type", "must be \"function\"");
    }
    const json* fn = tool.contains("function") ? &tool["function"] : nullptr;
    if (fn == nullptr || !fn->is_object()) return Bad(at + ".function", "is required");
    const std::string name = fn->contains("name") && (*fn)["name"].is_string()
                                 ? (*fn)["name"].get<std::string>()
                                 : std::string();
    if (!ValidFunctionName(name)) {
      return Bad(at + ".function.name", "must be 1 to 64 letters, digits, '_' or '-'");
    }
    if (!names.insert(name).second) return Bad(at + ".function.name", "is given twice");
    json parameters = {{"type", "object"}, {"properties", json::object()}};
    if (auto p = fn->find("parameters"); p != fn->end() && !p->is_null()) {
      if (!p->is_object()) return Bad(at + ".function.parameters", "must be a JSON schema object");
      parameters = *p;
    }
    json entry = {{"type", "function"}, {"function", {{"name", name}}}};
    if (auto d = fn->find("description"); d != fn->end() && d->is_string()) {
      entry["function"]["description"] = *d;
    }
    entry["function"]["parameters"] = parameters;
    list.push_back(std::move(entry));
    functions.emplace_back(name, std::move(parameters));
  }
  if (choice == nullptr || *choice == "auto") {
    if (model.tool_call_parser.empty()) {
      return Bad("tool_choice",
                 "\"auto\" (the default with tools) needs a parser of the model's tool-call "
                 "format: start the server with --tool-call-parser hermes (or llama3_json), or "
                 "name a function "
                 "({\"type\": \"function\", \"function\": {\"name\": ...}}) or use "
                 "\"required\"");
    }
    out->tool_choice = ParsedRequest::ToolChoice::kAuto;
    out->tool_parser = model.tool_call_parser;
    for (const auto& fn : functions) out->tool_names.push_back(fn.first);
    r->mutable_chat()->set_tools_json(list.dump());
    return absl::OkStatus();
  }
  if (*choice == "none") return absl::OkStatus();  // tools left out of the prompt, as vLLM does
  std::vector<std::pair<std::string, json>> candidates;
  if (*choice == "required") {
    if (functions.size() > 64) {
      return Bad("tool_choice", "\"required\" chooses among at most 64 tools; name one");
    }
    out->tool_choice = ParsedRequest::ToolChoice::kRequired;
    candidates = functions;
  } else if (choice->is_object() && StringField(*choice, "type") == "function" &&
             choice->contains("function") && (*choice)["function"].is_object() &&
             (*choice)["function"].contains("name") && (*choice)["function"]["name"].is_string()) {
    const std::string name = (*choice)["function"]["name"].get<std::string>();
    for (const auto& fn : functions) {
      if (fn.first == name) candidates.push_back(fn);
    }
    if (candidates.empty()) return Bad("tool_choice.function.name", "is not one of the tools");
    out->tool_choice = ParsedRequest::ToolChoice::kNamed;
  } else {
    return Bad("tool_choice",
               "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
               "\"function\": {\"name\": ...}}");
  }
  v1::SamplingOptions* s = r->mutable_sampling();
  if (!s->response_format().empty() && s->response_format() != "text") {
    return Bad("response_format", "cannot be combined with a forced tool_choice");
  }
  // The schemas of the tools that can be called are checked here, so that an error names the
  // tool (the others only go to the chat template: agents send all their tools every turn).
  for (const auto& [name, parameters] : candidates) {
    auto compiled = JsonSchema::Compile(parameters.dump());
    if (compiled.ok()) continue;
    size_t index = 0;
    while (functions[index].first != name) ++index;
    std::string message(compiled.status().message());
    constexpr std::string_view kRoot = "json_schema";
    if (message.rfind(kRoot, 0) == 0) message.erase(0, kRoot.size());
    const std::string field = absl::StrCat("tools[", index, "].function.parameters");
    const size_t colon = message.find(": ");
    return Bad(field + message.substr(0, colon),
               colon == std::string::npos ? message : message.substr(colon + 2));
  }
  json schema;
  if (candidates.size() == 1) {  // the output is the arguments
    out->tool_name = candidates[0].first;
    schema = candidates[0].second;
  } else {  // {"name": ..., "arguments": ...}: a union tagged by the name
    json alternatives = json::array(), defs = json::object();
    for (size_t i = 0; i < candidates.size(); ++i) {
      const std::string key = absl::StrCat("tool", i);
      json parameters = candidates[i].second;
      Rebase(&parameters, key);
      defs[key] = std::move(parameters);
      alternatives.push_back({{"type", "object"},
                              {"properties",
                               {{"name", {{"const", candidates[i].first}}},
                                {"arguments", {{"$ref", absl::StrCat("#/$defs/", key)}}}}},
                              {"required", {"name", "arguments"}}});
    }
    schema = {{"anyOf", std::move(alternatives)}, {"$defs", std::move(defs)}};
  }
  s->set_response_format("json_schema");
  s->set_json_schema(schema.dump());
  r->mutable_chat()->set_tools_json(list.dump());
  return absl::OkStatus();
}

// vLLM's structured outputs: "structured_outputs": {"regex" | "choice" | "json" | "grammar" |
// "json_object"}, the older top-level "guided_regex", "guided_choice", "guided_json",
// "guided_grammar", llama.cpp server's "grammar" and SGLang's "ebnf" (GBNF). At most one
// constraint per request, response_format's included.
absl::Status ParseStructuredOutputs(Fields& f, v1::SamplingOptions* s) {
  struct Given {
    std::string field, kind;
    const json* value;
  };
  std::vector<Given> given;
  if (const json* so = f.Get("structured_outputs")) {
    if (!so->is_object()) return Bad("structured_outputs", "must be an object");
    for (const auto& [key, value] : so->items()) {
      if (value.is_null()) continue;
      const std::string field = "structured_outputs." + key;
      if (key == "regex" || key == "choice" || key == "json" || key == "grammar") {
        given.push_back({field, key, &value});
      } else if (key == "json_object") {
        if (!value.is_boolean()) return Bad(field, "must be true or false");
        if (value.get<bool>()) given.push_back({field, key, &value});
      } else if (key == "structural_tag") {
        return Bad(field, "is not supported (regex, choice, json, grammar and json_object are)");
      }
    }
  }
  for (const char* kind : {"regex", "choice", "json", "grammar"}) {
    const std::string field = absl::StrCat("guided_", kind);
    if (const json* v = f.Get(field.c_str())) given.push_back({field, kind, v});
  }
  for (const char* field : {"grammar", "ebnf"}) {  // llama-server's and SGLang's names
    if (const json* v = f.Get(field)) given.push_back({field, "grammar", v});
  }
  if (given.empty()) return absl::OkStatus();
  if (given.size() > 1 || (!s->response_format().empty() && s->response_format() != "text")) {
    return Bad(given.back().field,
               "give one output constraint: response_format, regex, choice, json or grammar");
  }
  const auto& [field, kind, value] = given[0];
  std::string pattern;
  if (kind == "regex") {
    if (!value->is_string() || value->get<std::string>().empty()) {
      return Bad(field, "must be a non-empty string");
    }
    pattern = value->get<std::string>();
  } else if (kind == "choice") {
    if (!value->is_array() || value->empty() || value->size() > 4096) {
      return Bad(field, "must list 1 to 4096 strings");
    }
    std::vector<std::string> texts;
    for (const json& t : *value) {
      if (!t.is_string()) return Bad(field, "must list 1 to 4096 strings");
      texts.push_back(t.get<std::string>());
    }
    pattern = Regex::Alternatives(texts);
  } else if (kind == "json") {  // a schema, as an object or as its JSON text
    json schema = *value;
    if (value->is_string()) {
      if (!JsonAffordable(value->get<std::string>(), kMaxJsonDepth)) {
        return Bad(field, absl::StrCat("nests deeper than ", kMaxJsonDepth,
                                       " levels or has objects of too many members"));
      }
      schema = json::parse(value->get<std::string>(), nullptr, /*allow_exceptions=*/false);
    }
    if (!schema.is_object() && !schema.is_boolean()) return Bad(field, "must be a JSON Schema");
    s->set_response_format("json_schema");
    s->set_json_schema(schema.dump());
    return absl::OkStatus();
  } else if (kind == "grammar") {
    if (!value->is_string() || value->get<std::string>().empty()) {
      return Bad(field, "must be a non-empty GBNF grammar");
    }
    // Compiled here too, so that a bad grammar is a 400 naming the field.
    auto g = Grammar::Compile(value->get<std::string>());
    if (!g.ok()) return Bad(field, std::string(g.status().message()));
    s->set_response_format("grammar");
    s->set_grammar(value->get<std::string>());
    return absl::OkStatus();
  } else {  // json_object
    s->set_response_format("json_object");
    return absl::OkStatus();
  }
  // Compiled here too, so that a bad pattern is a 400 naming the field.
  auto re = Regex::Compile(pattern);
  if (!re.ok()) return Bad(field, std::string(re.status().message()));
  s->set_response_format("regex");
  s->set_regex(pattern);
  return absl::OkStatus();
}

// Sampling, stopping and selection fields shared by both endpoints.
absl::Status ParseCommon(Endpoint endpoint, Fields& f, const ServedModel& model,
                         v1::GenerateRequest* base, ParsedRequest* out) {
  v1::SamplingOptions* s = base->mutable_sampling();
  s->set_temperature(static_cast<float>(f.Number("temperature").value_or(1.0)));
  if (auto v = f.Number("top_p")) {
    // 0 keeps only the most likely token, as in OpenAI's API and llama.cpp (the proto's 0 is
    // "unset": the smallest positive float says it).
    s->set_top_p(*v == 0 ? std::numeric_limits<float>::min() : static_cast<float>(*v));
  }
  if (auto v = f.Integer("top_k", -1, std::numeric_limits<int32_t>::max())) {
    s->set_top_k(*v < 0 ? 0 : static_cast<int32_t>(*v));
  }
  if (auto v = f.Number("min_p")) s->set_min_p(static_cast<float>(*v));
  if (auto v = f.Number("repetition_penalty")) s->set_repetition_penalty(static_cast<float>(*v));
  if (auto v = f.Number("presence_penalty")) s->set_presence_penalty(static_cast<float>(*v));
  if (auto v = f.Number("frequency_penalty")) s->set_frequency_penalty(static_cast<float>(*v));
  if (const json* seed = f.Get("seed")) {
    if (!seed->is_number_integer()) return Bad("seed", "must be an integer");
    s->set_seed(seed->is_number_unsigned() ? seed->get<uint64_t>()
                                           : static_cast<uint64_t>(seed->get<int64_t>()));
  }
  const int32_t int_max = std::numeric_limits<int32_t>::max();
  std::optional<int64_t> max_tokens = f.Integer("max_tokens", 1, int_max);
  if (endpoint == Endpoint::kChat) {
    if (auto v = f.Integer("max_completion_tokens", 1, int_max)) max_tokens = v;
  }
  // Chat generates until the end of the context by default, as vLLM does; the engine stops
  // there (finish_reason "length").
  s->set_max_tokens(static_cast<int32_t>(max_tokens.value_or(
      endpoint == Endpoint::kChat ? model.max_context : kCompletionsDefaultMaxTokens)));
  if (const json* stop = f.Get("stop")) {
    if (stop->is_string()) {
      s->add_stop(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const json& x : *stop) {
        if (!x.is_string()) return Bad("stop", "must be a string or a list of strings");
        s->add_stop(x.get<std::string>());
      }
    } else {
      return Bad("stop", "must be a string or a list of strings");
    }
  }
  if (const json* ids = f.Get("stop_token_ids")) {
    if (!ids->is_array()) return Bad("stop_token_ids", "must be a list of token ids");
    for (const json& x : *ids) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > int_max) {
        return Bad("stop_token_ids", "must be a list of token ids");
      }
      s->add_stop_token_ids(static_cast<int32_t>(x.get<int64_t>()));
    }
  }
  if (auto v = f.Bool("ignore_eos")) s->set_ignore_eos(*v);
  if (auto v = f.Bool("skip_special_tokens")) s->set_skip_special_tokens(*v);
  if (auto v = f.Integer("prompt_logprobs", 0, 20)) {  // vLLM's
    s->set_prompt_logprobs(static_cast<int32_t>(*v));
    out->prompt_logprobs = true;
  }
  if (endpoint == Endpoint::kCompletions) {
    if (auto v = f.Integer("logprobs", 0, 20)) {
      s->set_logprobs(static_cast<int32_t>(*v));
      out->logprobs = true;
    }
  } else {
    out->logprobs = f.Bool("logprobs").value_or(false);
    const std::optional<int64_t> top = f.Integer("top_logprobs", 0, 20);
    if (top.has_value() && !out->logprobs) return Bad("top_logprobs", "needs \"logprobs\": true");
    if (out->logprobs) s->set_logprobs(static_cast<int32_t>(top.value_or(0)));
  }
  if (const json* sel = f.Get("selection")) {
    if (!sel->is_object()) return Bad("selection", "must be an object");
    google::protobuf::util::JsonParseOptions options;
    options.ignore_unknown_fields = false;
    auto st = google::protobuf::util::JsonStringToMessage(sel->dump(), base->mutable_selection(),
                                                          options);
    if (!st.ok()) return Bad("selection", std::string(st.message()));
  }
  if (auto v = f.Integer("min_tokens", 0, int_max)) s->set_min_tokens(static_cast<int32_t>(*v));
  if (const json* bias = f.Get("logit_bias")) {
    // {"token id": bias}: OpenAI's keys are strings.
    if (!bias->is_object()) return Bad("logit_bias", "must be an object of token id: bias");
    for (const auto& [key, value] : bias->items()) {
      int32_t id = -1;
      if (!absl::SimpleAtoi(key, &id) || id < 0) {
        return Bad("logit_bias", absl::StrCat("\"", key, "\" is not a token id"));
      }
      if (!value.is_number()) return Bad("logit_bias", "biases must be numbers");
      (*s->mutable_logit_bias())[id] = value.get<float>();
    }
  }
  if (auto v = f.String("cache_salt")) base->set_cache_salt(*v);
  TS_RETURN_IF_ERROR(ResolveAdapter(f, model, base->mutable_lora_adapter()));
  if (auto v = f.Integer("priority", std::numeric_limits<int32_t>::min(), int_max)) {
    base->set_priority(static_cast<int32_t>(*v));
  }
  if (const json* format = f.Get("response_format")) {
    const std::string type = format->is_object() ? StringField(*format, "type") : "";
    if (type == "json_object") {
      s->set_response_format(type);
    } else if (type == "json_schema") {
      // {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}
      const json* spec = format->contains("json_schema") ? &(*format)["json_schema"] : nullptr;
      if (spec == nullptr || !spec->is_object() || !spec->contains("schema")) {
        return Bad("response_format.json_schema.schema", "is required");
      }
      s->set_response_format(type);
      s->set_json_schema((*spec)["schema"].dump());
    } else if (type != "text") {
      return Bad("response_format", "type must be text, json_object or json_schema");
    }
  }
  if (absl::Status st = ParseStructuredOutputs(f, s); !st.ok()) return st;
  return f.status();
}

std::string FinishReasonName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_EOS:
    case v1::FINISH_REASON_STOP_TOKEN:
    case v1::FINISH_REASON_STOP_STRING:
      return "stop";
    case v1::FINISH_REASON_ABORT:
    case v1::FINISH_REASON_DEADLINE:
      return "abort";
    default:
      return "error";
  }
}

json Bytes(const std::string& s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(static_cast<int>(c));
  return out;
}

std::string Event(const json& object) {
  return absl::StrCat("data: ", object.dump(-1, ' ', false, json::error_handler_t::replace),
                      "\n\n");
}

// vLLM's stop_reason: the stop string or stop token id that ended the output, else null.
json StopReason(const v1::Complete& c) {
  if (c.finish_reason() == v1::FINISH_REASON_STOP_STRING) return c.stop_string();
  if (c.finish_reason() == v1::FINISH_REASON_STOP_TOKEN && c.has_stop_token_id()) {
    return c.stop_token_id();
  }
  return nullptr;
}

// TinyServe's own figures of a finished choice: which worker, the exact finish, timing and
// page selection (numbers stay numbers, unlike proto3 JSON's int64 strings).
json TinyServeStats(const v1::Complete& c) {
  const v1::Timing& t = c.timing();
  const v1::SelectionStats& s = c.selection();
  return {{"worker", c.worker()},
          {"finish_reason", v1::FinishReason_Name(c.finish_reason())},
          {"preemptions", c.usage().preemptions()},
          {"speculative",
           {{"draft_tokens", c.usage().spec_draft_tokens()},
            {"accepted_tokens", c.usage().spec_accepted_tokens()}}},
          {"timing",
           {{"queue_seconds", t.queue_seconds()},
            {"ttft_seconds", t.ttft_seconds()},
            {"prefill_seconds", t.prefill_seconds()},
            {"decode_seconds", t.decode_seconds()},
            {"e2e_seconds", t.e2e_seconds()}}},
          {"selection",
           {{"policy", s.policy()},
            {"steps", s.steps()},
            {"pages_scored", s.pages_scored()},
            {"pages_selected", s.pages_selected()},
            {"kv_bytes_read", s.kv_bytes_read()},
            {"kv_bytes_dense", s.kv_bytes_dense()},
            {"page_hit_rate", s.page_hit_rate()},
            {"mass_recall", s.mass_recall()},
            {"reuse", s.reuse()}}}};
}

}  // namespace

absl::StatusOr<json> ParseBody(std::string_view body) {
  // Nesting is bounded before parsing: what follows (dump, protobuf's JSON parser) recurses;
  // and so is the parse's own work (ordered_json's objects scan their keys).
  const JsonCost cost = MeasureJson(body);
  if (cost.nesting > kMaxJsonDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("the body nests deeper than ", kMaxJsonDepth, " levels"));
  }
  if (cost.ordered_work > kMaxJsonOrderedWork) {
    return absl::InvalidArgumentError(
        "the body's objects have too many members (10,000 in one object at most, fewer in "
        "several)");
  }
  json root = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError("the body is not valid JSON");
  if (!root.is_object()) return absl::InvalidArgumentError("the body must be a JSON object");
  return root;
}

absl::StatusOr<v1::EmbedRequest> ParseEmbeddingsRequest(std::string_view body,
                                                        const ServedModel& model, bool* base64) {
  TS_ASSIGN_OR_RETURN(const json root, ParseBody(body));
  Fields f(root, "");
  v1::EmbedRequest out;
  std::vector<Prompt> inputs;
  TS_RETURN_IF_ERROR(ParsePrompts(f, "input", &inputs));
  for (const Prompt& p : inputs) {
    v1::EmbedInput* in = out.add_inputs();
    if (p.is_text) {
      in->set_text(p.text);
    } else {
      in->mutable_token_ids()->mutable_ids()->Add(p.ids.begin(), p.ids.end());
    }
  }
  out.set_parse_special_tokens(true);  // as the completions route tokenizes
  const std::string format = f.String("encoding_format").value_or("float");
  if (format != "float" && format != "base64")
    return Bad("encoding_format", "must be \"float\" or \"base64\"");
  *base64 = format == "base64";
  f.RejectUnless("dimensions", false, "is not supported (the vectors have the model's width)");
  out.set_normalize(f.Bool("normalize").value_or(true));
  const std::string pooling = f.String("pooling").value_or("last");
  if (pooling != "last" && pooling != "mean") return Bad("pooling", "must be \"last\" or \"mean\"");
  out.set_pooling(pooling == "mean" ? v1::POOLING_MEAN : v1::POOLING_LAST);
  if (auto v = f.Bool("add_special_tokens")) out.set_add_special_tokens(*v);
  if (auto v = f.Integer("priority", std::numeric_limits<int32_t>::min(),
                         std::numeric_limits<int32_t>::max()))
    out.set_priority(static_cast<int32_t>(*v));
  if (auto v = f.String("cache_salt")) out.set_cache_salt(*v);
  if (auto v = f.String("request_id")) out.set_request_id(*v);
  f.String("user");
  TS_RETURN_IF_ERROR(f.status());
  TS_RETURN_IF_ERROR(ResolveAdapter(f, model, out.mutable_lora_adapter()));
  TS_RETURN_IF_ERROR(f.status());
  return out;
}

Json EmbeddingsResponse(const v1::EmbedResponse& response, const std::string& model, bool base64) {
  Json data = Json::array();
  for (int i = 0; i < response.embeddings_size(); ++i) {
    const auto& values = response.embeddings(i).values();
    Json embedding;
    if (base64) {  // OpenAI's: the float32 vector's little-endian bytes
      std::string bytes(reinterpret_cast<const char*>(values.data()),
                        values.size() * sizeof(float));
      embedding = absl::Base64Escape(bytes);
    } else {
      embedding = std::vector<float>(values.begin(), values.end());
    }
    data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", std::move(embedding)}});
  }
  return {
      {"object", "list"},
      {"data", std::move(data)},
      {"model", model},
      {"usage",
       {{"prompt_tokens", response.prompt_tokens()}, {"total_tokens", response.prompt_tokens()}}}};
}

absl::StatusOr<ParsedRequest> ParseRequest(Endpoint endpoint, std::string_view body,
                                           const ServedModel& model,
                                           const std::string& request_id) {
  TS_ASSIGN_OR_RETURN(const json root, ParseBody(body));
  return ParseRequestJson(endpoint, root, model, request_id);
}

absl::StatusOr<ParsedRequest> ParseRequestJson(Endpoint endpoint, const json& root,
                                               const ServedModel& model,
                                               const std::string& request_id) {
  if (endpoint != Endpoint::kCompletions && endpoint != Endpoint::kChat) {
    return absl::InternalError("only completions and chat bodies are parsed here");
  }
  Fields f(root, "");
  ParsedRequest out;
  out.endpoint = endpoint;
  out.model = f.String("model").value_or(model.name);
  if (endpoint == Endpoint::kChat) out.reasoning_parser = model.reasoning_parser;
  out.n = static_cast<int>(f.Integer("n", 1, kMaxChoices).value_or(1));
  const auto best_of = f.Integer("best_of", 1, kMaxChoices);
  f.RejectUnless("best_of", best_of.value_or(out.n) == out.n, "only best_of == n is supported");
  out.stream = f.Bool("stream").value_or(false);
  if (const json* so = f.Get("stream_options")) {
    if (!out.stream) return Bad("stream_options", "is only allowed with \"stream\": true");
    if (!so->is_object()) return Bad("stream_options", "must be an object");
    Fields sf(*so, "stream_options.");
    out.include_usage = sf.Bool("include_usage").value_or(false);
    TS_RETURN_IF_ERROR(sf.status());
  }
  TS_RETURN_IF_ERROR(f.status());

  v1::GenerateRequest base;
  TS_RETURN_IF_ERROR(ParseCommon(endpoint, f, model, &base, &out));
  std::vector<v1::GenerateRequest> prompts;
  std::vector<std::string> echo;
  if (endpoint == Endpoint::kCompletions) {
    std::vector<Prompt> parsed;
    TS_RETURN_IF_ERROR(ParsePrompts(f, "prompt", &parsed));
    const bool want_echo = f.Bool("echo").value_or(false);
    const std::optional<std::string> suffix = f.String("suffix");
    f.RejectUnless("suffix", suffix.value_or("").empty(), "is not supported");
    TS_RETURN_IF_ERROR(f.status());
    // echo with logprobs (how lm-evaluation-harness scores a text): the prompt's tokens and
    // logprobs lead the output's.
    if (want_echo && out.logprobs) {
      out.echo_logprobs = true;
      if (!base.sampling().has_prompt_logprobs()) {
        base.mutable_sampling()->set_prompt_logprobs(base.sampling().logprobs());
      }
    }
    for (const Prompt& p : parsed) {
      if (want_echo && !p.is_text) return Bad("echo", "needs a text prompt");
      v1::GenerateRequest r = base;
      if (p.is_text) {
        r.set_text(p.text);
        r.set_parse_special_tokens(true);  // "<|im_start|>" is one token (vLLM, llama.cpp)
      } else {
        r.mutable_token_ids()->mutable_ids()->Assign(p.ids.begin(), p.ids.end());
      }
      prompts.push_back(std::move(r));
      echo.push_back(want_echo ? p.text : std::string());
    }
  } else {
    v1::GenerateRequest r = base;
    TS_RETURN_IF_ERROR(ParseMessages(f, r.mutable_chat()));
    TS_RETURN_IF_ERROR(ParseTools(f, model, &r, &out));
    // A reasoning model (--reasoning-parser): constrained decoding holds only the answer after
    // its <think> block, and thinking_token_budget (vLLM's) closes the block after N tokens
    // (worker/sampling/reasoning_constraint.h). A forced tool call is held from the first token.
    const std::optional<int64_t> budget =
        f.Integer("thinking_token_budget", 0, std::numeric_limits<int32_t>::max());
    const bool forced_call = out.tool_choice == ParsedRequest::ToolChoice::kNamed ||
                             out.tool_choice == ParsedRequest::ToolChoice::kRequired;
    if (budget.has_value() && model.reasoning_parser.empty())
      return Bad("thinking_token_budget", "needs a server started with --reasoning-parser");
    if (budget.has_value() && forced_call)
      return Bad("thinking_token_budget",
                 "cannot be combined with a forced tool call (tool_choice \"required\" or a "
                 "named function)");
    // The worker then also says where the prompt left the block (Chunk.reasoning_start), so
    // the output is split as it was held.
    if (!model.reasoning_parser.empty() && !forced_call) {
      r.mutable_sampling()->set_reasoning_format(model.reasoning_parser);
      if (budget.has_value())
        r.mutable_sampling()->set_thinking_token_budget(static_cast<int32_t>(*budget));
    }
    // vLLM's: continue the final (assistant) message instead of starting a new turn.
    const bool continue_final = f.Bool("continue_final_message").value_or(false);
    const std::optional<bool> generation_prompt = f.Bool("add_generation_prompt");
    TS_RETURN_IF_ERROR(f.status());
    if (continue_final && generation_prompt.value_or(false)) {
      return Bad("continue_final_message", "cannot be combined with add_generation_prompt");
    }
    if (generation_prompt.has_value())
      r.mutable_chat()->set_add_generation_prompt(*generation_prompt);
    r.mutable_chat()->set_continue_final_message(continue_final);
    // vLLM's: more variables for the chat template ({"enable_thinking": false} for Qwen3),
    // and OpenAI's reasoning_effort as the template's variable of that name.
    Json kwargs = Json::object();
    if (const Json* k = f.Get("chat_template_kwargs")) {
      if (!k->is_object()) return Bad("chat_template_kwargs", "must be an object");
      kwargs = *k;
    }
    if (std::optional<std::string> effort = f.String("reasoning_effort")) {
      static constexpr std::string_view kEfforts[] = {"none", "minimal", "low", "medium", "high"};
      if (std::find(std::begin(kEfforts), std::end(kEfforts), *effort) == std::end(kEfforts))
        return Bad("reasoning_effort", "must be none, minimal, low, medium or high");
      if (!kwargs.contains("reasoning_effort")) kwargs["reasoning_effort"] = *effort;
    }
    TS_RETURN_IF_ERROR(f.status());
    if (!kwargs.empty()) r.mutable_chat()->set_template_kwargs_json(Dump(kwargs));
    prompts.push_back(std::move(r));
    echo.emplace_back();
  }
  if (prompts.size() * out.n > kMaxChoices) {
    return Bad(
        "n", absl::StrCat("prompts x n is ", prompts.size() * out.n, ", more than ", kMaxChoices));
  }
  const std::string id_base = f.String("request_id").value_or(request_id);
  TS_RETURN_IF_ERROR(f.status());
  const bool many = prompts.size() * out.n > 1;
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (int j = 0; j < out.n; ++j) {
      v1::GenerateRequest r = prompts[p];
      const size_t i = p * out.n + j;
      r.set_request_id(many ? absl::StrCat(id_base, "-", i) : id_base);
      // n samples of one seeded request: seed, seed + 1, ... (different but reproducible).
      if (j > 0 && r.sampling().has_seed()) {
        r.mutable_sampling()->set_seed(r.sampling().seed() + j);
      }
      out.calls.push_back(std::move(r));
      out.echo.push_back(echo[p]);
    }
  }
  return out;
}

int HttpStatusOf(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return 200;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::FAILED_PRECONDITION:
      return 400;
    case grpc::StatusCode::UNAUTHENTICATED:
      return 401;
    case grpc::StatusCode::PERMISSION_DENIED:
      return 403;
    case grpc::StatusCode::NOT_FOUND:
      return 404;
    case grpc::StatusCode::ALREADY_EXISTS:  // a request id or adapter name in use
      return 409;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return 429;
    case grpc::StatusCode::CANCELLED:
      return 499;
    case grpc::StatusCode::UNIMPLEMENTED:
      return 501;
    case grpc::StatusCode::UNAVAILABLE:
      return 503;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return 504;
    default:
      return 500;
  }
}

namespace {

// The field a worker's INVALID_ARGUMENT message names: TinyServe's messages start with it
// ("temperature must be ...", "token_ids.ids[3] = ...", "stop: ...").
std::string LeadingField(const std::string& message) {
  size_t n = 0;
  while (n < message.size() &&
         (std::isalnum(static_cast<unsigned char>(message[n])) || message[n] == '_' ||
          message[n] == '.' || message[n] == '[' || message[n] == ']')) {
    ++n;
  }
  const bool ends_word = n < message.size() && (message[n] == ' ' || message[n] == ':');
  return n > 0 && ends_word && std::islower(static_cast<unsigned char>(message[0]))
             ? message.substr(0, n)
             : std::string();
}

}  // namespace

json ErrorBody(const grpc::Status& status, std::optional<std::string> param_in) {
  const int http = HttpStatusOf(status.error_code());
  const std::string param = param_in.has_value() ? *param_in
                            : http == 400        ? LeadingField(status.error_message())
                                                 : std::string();
  const char* type = http == 401   ? "authentication_error"
                     : http == 403 ? "permission_error"
                     : http == 404 ? "not_found_error"
                     : http == 429 ? "rate_limit_error"
                     : http < 500  ? "invalid_request_error"  // 400, 409 (a request id in use)...
                     : http == 503 ? "service_unavailable_error"
                     : http == 504 ? "timeout_error"
                                   : "server_error";
  return {{"error",
           {{"message", status.error_message()},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", StatusCodeName(status.error_code())}}}};
}

json ErrorBody(const absl::Status& status) {
  std::string param;  // our own errors name their field here, or no field
  if (auto p = status.GetPayload(kParamPayload)) param = std::string(*p);
  return ErrorBody(
      grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message())),
      param);
}

ResponseBuilder::ResponseBuilder(const ParsedRequest& request, std::string id, int64_t created)
    : request_(request), id_(std::move(id)), created_(created), choices_(request.calls.size()) {
  for (size_t i = 0; i < choices_.size(); ++i) choices_[i].text = request.echo[i];
}

json ResponseBuilder::ChunkObject(json choices) const {
  json o = {{"id", id_},
            {"object",
             request_.endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
            {"created", created_},
            {"model", request_.model},
            {"choices", std::move(choices)}};
  if (request_.include_usage) o["usage"] = nullptr;
  return o;
}

json ResponseBuilder::ChoiceDelta(int index, const std::string& text, const json& logprobs,
                                  const std::string& finish_reason, bool first) const {
  json c = {{"index", index}};
  if (request_.endpoint == Endpoint::kChat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (first || !text.empty()) delta["content"] = text;
    c["delta"] = std::move(delta);
  } else {
    c["text"] = text;
  }
  c["logprobs"] = logprobs;
  c["finish_reason"] = finish_reason.empty() ? json(nullptr) : json(finish_reason);
  if (!finish_reason.empty()) c["stop_reason"] = StopReason(choices_[index].complete);
  return c;
}

void ResponseBuilder::AddLogprobs(Choice& choice, const v1::Chunk& chunk, json* out) {
  if (request_.endpoint == Endpoint::kChat) {
    json content = json::array();
    for (const v1::TokenLogprobs& lp : chunk.logprobs()) {
      json top = json::array();
      for (const v1::TopLogprob& t : lp.top()) {
        top.push_back({{"token", t.text()}, {"logprob", t.logprob()}, {"bytes", Bytes(t.text())}});
      }
      content.push_back({{"token", lp.text()},
                         {"logprob", lp.logprob()},
                         {"bytes", Bytes(lp.text())},
                         {"top_logprobs", std::move(top)}});
    }
    *out = {{"content", std::move(content)}};
    return;
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       offsets = json::array();
  if (request_.echo_logprobs) {  // the echoed prompt's tokens lead (the first has no logprob)
    for (int i = 0; i < chunk.prompt_logprobs_size(); ++i) {
      const v1::TokenLogprobs& lp = chunk.prompt_logprobs(i);
      tokens.push_back(lp.text());
      json top = json::object();
      for (const v1::TopLogprob& t : lp.top()) top[t.text()] = t.logprob();
      token_logprobs.push_back(i == 0 ? json(nullptr) : json(lp.logprob()));
      top_logprobs.push_back(i == 0 ? json(nullptr) : std::move(top));
      offsets.push_back(choice.text_offset);
      choice.text_offset += static_cast<int>(lp.text().size());
    }
  }
  for (const v1::TokenLogprobs& lp : chunk.logprobs()) {
    tokens.push_back(lp.text());
    token_logprobs.push_back(lp.logprob());
    json top = json::object();
    for (const v1::TopLogprob& t : lp.top()) top[t.text()] = t.logprob();
    top_logprobs.push_back(std::move(top));
    offsets.push_back(choice.text_offset);
    choice.text_offset += static_cast<int>(lp.text().size());
  }
  *out = {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top_logprobs)},
          {"text_offset", std::move(offsets)}};
}

void ResponseBuilder::AddPromptLogprobs(Choice& choice, const v1::Chunk& chunk) {
  if (!request_.prompt_logprobs || chunk.prompt_logprobs_size() == 0) return;
  json out = json::array({nullptr});  // the first token has no context
  for (int i = 1; i < chunk.prompt_logprobs_size(); ++i) {
    const v1::TokenLogprobs& lp = chunk.prompt_logprobs(i);
    json position = json::object();
    for (int k = 0; k < lp.top_size(); ++k) {
      const v1::TopLogprob& t = lp.top(k);
      position[std::to_string(t.token_id())] = {
          {"logprob", t.logprob()}, {"rank", k + 1}, {"decoded_token", t.text()}};
    }
    position[std::to_string(lp.token_id())] = {
        {"logprob", lp.logprob()}, {"rank", lp.rank()}, {"decoded_token", lp.text()}};
    out.push_back(std::move(position));
  }
  choice.prompt_logprobs = std::move(out);
}

namespace {

size_t SkipSpace(const std::string& t, size_t i) {
  while (i < t.size() && (t[i] == ' ' || t[i] == '\n' || t[i] == '\r' || t[i] == '\t')) ++i;
  return i;
}

}  // namespace

namespace {

// An OpenAI tool call object with a fresh id.
json CallObject(const std::string& name, const std::string& arguments) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kAlnum[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  std::string id = "call_";
  for (int k = 0; k < 24; ++k) id += kAlnum[rng() % (sizeof(kAlnum) - 1)];
  return {
      {"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}};
}

// The length of the longest end of `text` that starts `marker` (text held back while streaming,
// since the next chunk may complete the marker).
size_t PartialMarkerAtEnd(const std::string& text, std::string_view marker) {
  for (size_t k = std::min(marker.size() - 1, text.size()); k > 0; --k)
    if (text.compare(text.size() - k, k, marker.substr(0, k)) == 0) return k;
  return 0;
}

}  // namespace

json ResponseBuilder::ToolCall(const std::string& text) const {
  // Only a whole value is a call (max_tokens may cut it); the check is the constraint's own
  // recognizer, so whatever decoding allowed (1e400, a lone escaped surrogate) passes.
  JsonRecognizer whole(/*object_only=*/false);
  if (!whole.Feed(text) || !whole.CanEnd()) return nullptr;
  std::string name = request_.tool_name;
  std::string arguments;
  if (!name.empty()) {
    arguments = text;  // the arguments as written (vLLM passes them through too)
  } else {
    // {"name": "<tool>", "arguments": <value>}, as the tagged-union schema writes it.
    size_t i = SkipSpace(text, 0);
    if (text.compare(i, 1, "{") != 0) return nullptr;
    i = SkipSpace(text, i + 1);
    if (text.compare(i, 6, "\"name\"") != 0) return nullptr;
    i = SkipSpace(text, i + 6);
    if (text.compare(i, 1, ":") != 0) return nullptr;
    i = SkipSpace(text, i + 1);
    size_t end = i + 1;
    while (end < text.size() && text[end] != '"') end += text[end] == '\\' ? 2 : 1;
    if (end >= text.size()) return nullptr;
    json tag = json::parse(text.substr(i, end - i + 1), nullptr, /*allow_exceptions=*/false);
    if (!tag.is_string()) return nullptr;
    name = tag.get<std::string>();
    i = SkipSpace(text, end + 1);
    if (text.compare(i, 1, ",") != 0) return nullptr;
    i = SkipSpace(text, i + 1);
    if (text.compare(i, 11, "\"arguments\"") != 0) return nullptr;
    i = SkipSpace(text, i + 11);
    if (text.compare(i, 1, ":") != 0) return nullptr;
    const size_t last = text.find_last_of('}');
    if (last == std::string::npos || last <= i) return nullptr;
    arguments = text.substr(i + 1, last - i - 1);
  }
  const size_t b = SkipSpace(arguments, 0);
  size_t e = arguments.size();
  while (e > b && SkipSpace(arguments, e - 1) != e - 1) --e;  // trailing whitespace
  arguments = arguments.substr(b, e - b);
  return CallObject(name, arguments);
}

namespace {

constexpr std::string_view kPythonTag = "<|python_tag|>";

// The end of the JSON value starting at text[i] (an object or array: brackets counted outside
// strings), or npos when it does not close.
size_t JsonValueEnd(const std::string& text, size_t i) {
  int depth = 0;
  bool in_string = false;
  for (; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      if (ch == '\\') {
        ++i;
      } else if (ch == '"') {
        in_string = false;
      }
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '{' || ch == '[') {
      ++depth;
    } else if (ch == '}' || ch == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string::npos;
}

}  // namespace

size_t ResponseBuilder::AutoContentLimit(const std::string& text, size_t sent) const {
  if (request_.tool_parser == "llama3_json") {
    // vLLM's reading: the output is calls only when it begins with one; until that is decided
    // (nothing but whitespace yet, or a "{" or the python tag begun) nothing goes out.
    if (sent > 0) return text.size();
    const size_t b = SkipSpace(text, 0);
    const std::string_view rest = std::string_view(text).substr(b);
    if (rest.empty() || rest[0] == '{' || kPythonTag.substr(0, rest.size()) == rest ||
        rest.substr(0, kPythonTag.size()) == kPythonTag) {
      return 0;
    }
    return text.size();
  }
  // hermes: content flows until a <tool_call> begins (a partial marker at the end waits).
  const size_t marker = text.find("<tool_call>");
  return marker != std::string::npos ? marker
                                     : text.size() - PartialMarkerAtEnd(text, "<tool_call>");
}

json ResponseBuilder::AutoToolCalls(const std::string& text, std::string* content) const {
  auto known = [&](const json& call) {
    return call.is_object() && call.contains("name") && call["name"].is_string() &&
           std::find(request_.tool_names.begin(), request_.tool_names.end(),
                     call["name"].get<std::string>()) != request_.tool_names.end();
  };
  if (request_.tool_parser == "llama3_json") {
    size_t i = SkipSpace(text, 0);
    if (text.compare(i, kPythonTag.size(), kPythonTag) == 0)
      i = SkipSpace(text, i + kPythonTag.size());
    if (i >= text.size() || text[i] != '{') return nullptr;
    content->clear();
    json calls = json::array();
    while (i < text.size()) {
      const size_t end = JsonValueEnd(text, i);
      if (end == std::string::npos) return nullptr;
      const std::string_view one = std::string_view(text).substr(i, end - i);
      if (!JsonAffordable(one, kMaxJsonDepth)) return nullptr;  // the output is untrusted too
      const json call = json::parse(one, nullptr, /*allow_exceptions=*/false);
      if (!known(call)) return nullptr;
      const char* key = call.contains("parameters") ? "parameters" : "arguments";
      if (!call.contains(key)) return nullptr;
      calls.push_back(CallObject(call["name"].get<std::string>(),
                                 call[key].dump(-1, ' ', false, json::error_handler_t::replace)));
      i = SkipSpace(text, end);
      if (i < text.size()) {
        if (text[i] != ';') return nullptr;
        i = SkipSpace(text, i + 1);
      }
    }
    return calls;
  }
  constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>";
  size_t at = text.find(kOpen);
  if (at == std::string::npos) return nullptr;
  *content = text.substr(0, at);
  json calls = json::array();
  while (at != std::string::npos) {
    const size_t body = at + kOpen.size();
    const size_t end = std::min(text.find(kClose, body), text.size());
    // The output is untrusted too (a guided regex can make it anything): bounded nesting, since
    // copying and dumping recurse, and bounded objects.
    if (!JsonAffordable(std::string_view(text).substr(body, end - body), kMaxJsonDepth))
      return nullptr;
    const json call = json::parse(text.substr(body, end - body), nullptr,
                                  /*allow_exceptions=*/false);
    if (!known(call) || !call.contains("arguments")) return nullptr;
    // As vLLM: the arguments as JSON text (json.dumps), whatever their type.
    calls.push_back(
        CallObject(call["name"].get<std::string>(),
                   call["arguments"].dump(-1, ' ', false, json::error_handler_t::replace)));
    at = end == text.size() ? std::string::npos : text.find(kOpen, end + kClose.size());
  }
  return calls;
}

ReasoningSplit SplitReasoning(std::string_view text, const std::string& parser, bool final) {
  constexpr std::string_view kOpen = "<think>", kClose = "</think>";
  const size_t n = text.size();
  ReasoningSplit s;  // no reasoning: all of it content
  s.stable = n;
  if (parser.empty()) return s;
  if (final) {  // vLLM's: partition at the first <think>, then at the first </think> after it
    const size_t open = text.find(kOpen);
    const size_t begin = open == std::string_view::npos ? 0 : open + kOpen.size();
    const size_t close = text.find(kClose, begin);
    if (close != std::string_view::npos &&
        (parser == "deepseek_r1" || open != std::string_view::npos)) {
      s.reasoning_begin = begin;
      s.reasoning_end = close;
      s.content_begin = close + kClose.size();
    } else if (parser == "deepseek_r1") {  // never closed: all reasoning
      s.reasoning_begin = begin;
      s.reasoning_end = s.content_begin = n;
    }
    return s;
  }
  // Streaming: a block opens at the start, after any whitespace (deepseek_r1: or is open from
  // the prompt).
  const size_t lead = std::min(text.find_first_not_of(" \t\r\n"), n);
  const std::string_view rest = text.substr(lead);
  if (rest.size() < kOpen.size() && kOpen.substr(0, rest.size()) == rest) {
    s.stable = 0;  // may still become "<think>"
    return s;
  }
  const bool opened = rest.substr(0, kOpen.size()) == kOpen;
  if (!opened && parser == "qwen3") return s;
  s.reasoning_begin = opened ? lead + kOpen.size() : 0;
  const size_t close = text.find(kClose, s.reasoning_begin);
  if (close != std::string_view::npos) {
    s.reasoning_end = close;
    s.content_begin = close + kClose.size();
    return s;
  }
  size_t held = 0;  // a tail that may still become "</think>"
  for (size_t k = std::min(kClose.size() - 1, n - s.reasoning_begin); k > 0 && held == 0; --k)
    if (text.substr(n - k) == kClose.substr(0, k)) held = k;
  s.stable = n - held;
  s.reasoning_end = s.content_begin = s.stable;
  return s;
}

std::string ResponseBuilder::StreamReasoning(Choice& c, bool done, std::string* answer) const {
  const std::string& t = c.text;
  ReasoningSplit s = SplitReasoning(t, ParserOf(c), /*final=*/false);
  if (done && s.stable < t.size()) {
    if (s.stable == 0 && s.reasoning_end == 0) {  // a bare "<thi...": content after all
      s = ReasoningSplit();
    } else {  // a block never closed: the held tail is reasoning too
      s.reasoning_end = s.content_begin = t.size();
    }
    s.stable = t.size();
  }
  std::string out;
  if (s.reasoning_end > std::max(c.rsent, s.reasoning_begin)) {
    const size_t from = std::max(c.rsent, s.reasoning_begin);
    out = t.substr(from, s.reasoning_end - from);
  }
  c.rsent = std::max(c.rsent, s.reasoning_end);
  *answer = s.stable > s.content_begin ? t.substr(s.content_begin, s.stable - s.content_begin) : "";
  return out;
}

std::vector<json> ResponseBuilder::ReasoningChunks(int index,
                                                   const v1::GenerateResponse& response) {
  Choice& c = choices_[index];
  const bool done = response.has_complete();
  json lp = nullptr;
  if (response.has_chunk()) {
    AddPromptLogprobs(c, response.chunk());
    if (request_.logprobs) AddLogprobs(c, response.chunk(), &lp);
    c.text += response.chunk().text();
  } else if (done) {
    c.complete = response.complete();
    c.finish_reason = FinishReasonName(c.complete.finish_reason());
  } else {
    return {};  // an in-band Error: OnFailure follows
  }
  std::string answer;
  const std::string thought = StreamReasoning(c, done, &answer);
  size_t limit = answer.size();  // how much of the answer may go out now (c.sent: so far)
  if (request_.tool_choice == ParsedRequest::ToolChoice::kAuto) {
    if (!done) {
      limit = AutoContentLimit(answer, c.sent);
    } else {
      std::string content;
      c.tool_calls = AutoToolCalls(answer, &content);
      if (!c.tool_calls.is_null()) {
        c.content = content.empty() ? json(nullptr) : json(content);
        c.finish_reason = "tool_calls";
        limit = content.size();
      }
    }
  }
  const std::string text = limit > c.sent ? answer.substr(c.sent, limit - c.sent) : "";
  c.sent = std::max(c.sent, limit);
  std::vector<json> out;
  const bool first = !c.started;
  if (first || !thought.empty() || !text.empty() || !lp.is_null()) {
    json choice = ChoiceDelta(index, text, lp, "", first);
    if (!thought.empty()) choice["delta"]["reasoning_content"] = thought;
    if (first && request_.prompt_logprobs) choice["prompt_logprobs"] = c.prompt_logprobs;
    c.started = true;
    out.push_back(ChunkObject(json::array({std::move(choice)})));
  }
  if (done) AppendCallsAndFinish(index, c, &out);
  return out;
}

void ResponseBuilder::AppendCallsAndFinish(int index, const Choice& c,
                                           std::vector<json>* out) const {
  if (!c.tool_calls.is_null()) {
    json calls = c.tool_calls;
    for (size_t k = 0; k < calls.size(); ++k) calls[k]["index"] = k;
    out->push_back(ChunkObject(json::array({json{{"index", index},
                                                 {"delta", {{"tool_calls", std::move(calls)}}},
                                                 {"logprobs", nullptr},
                                                 {"finish_reason", nullptr}}})));
  }
  out->push_back(
      ChunkObject(json::array({ChoiceDelta(index, "", nullptr, c.finish_reason, false)})));
}

std::vector<json> ResponseBuilder::Chunks(int index, const v1::GenerateResponse& response) {
  Choice& c = choices_[index];
  const bool auto_tools = request_.tool_choice == ParsedRequest::ToolChoice::kAuto;
  const bool tools = request_.tool_choice != ParsedRequest::ToolChoice::kOff && !auto_tools;
  // A thinking model's <think> block (not with a forced call: that output is the call's JSON).
  const bool reasoning = !request_.reasoning_parser.empty() && !tools;
  if (reasoning && response.has_chunk() && !c.parser.has_value()) {
    switch (response.chunk().reasoning_start()) {
      case v1::REASONING_START_OPEN:
        c.parser = "deepseek_r1";
        break;
      case v1::REASONING_START_CLOSED:
        c.parser = "";
        break;
      default:
        c.parser = request_.reasoning_parser;
    }
  }
  if (reasoning && request_.stream) return ReasoningChunks(index, response);
  if (response.has_chunk()) {
    const v1::Chunk& chunk = response.chunk();
    AddPromptLogprobs(c, chunk);
    json lp = nullptr;
    if (request_.logprobs) AddLogprobs(c, chunk, &lp);
    if (auto_tools && request_.stream) {
      // Content streams until a call may have begun; the calls go out whole at the end.
      c.text += chunk.text();
      const size_t limit = AutoContentLimit(c.text, c.sent);
      const std::string text = limit > c.sent ? c.text.substr(c.sent, limit - c.sent) : "";
      c.sent = std::max(c.sent, limit);
      if (text.empty() && lp.is_null() && c.started) return {};
      const bool first = !c.started;
      c.started = true;
      json choice = ChoiceDelta(index, text, lp, "", first);
      if (first && request_.prompt_logprobs) choice["prompt_logprobs"] = c.prompt_logprobs;
      return {ChunkObject(json::array({std::move(choice)}))};
    }
    if (tools && request_.stream) {  // the call is sent whole, once it is complete
      c.text += chunk.text();
      if (!lp.is_null()) {
        if (c.logprobs.is_null()) c.logprobs = json{{"content", json::array()}};
        for (json& v : lp["content"]) c.logprobs["content"].push_back(std::move(v));
      }
      return {};
    }
    if (!request_.stream) {
      c.text += chunk.text();
      if (lp.is_null()) return {};
      if (c.logprobs.is_null()) {
        c.logprobs = std::move(lp);
      } else {
        for (auto& [key, values] : lp.items()) {
          for (json& v : values) c.logprobs[key].push_back(std::move(v));
        }
      }
      return {};
    }
    // The echoed prompt rides on a choice's first event.
    const std::string text = c.started ? chunk.text() : c.text + chunk.text();
    const bool first = !c.started;
    c.started = true;
    json choice = ChoiceDelta(index, text, lp, "", first);
    if (first && request_.prompt_logprobs) choice["prompt_logprobs"] = c.prompt_logprobs;
    return {ChunkObject(json::array({std::move(choice)}))};
  }
  if (response.has_complete()) {
    c.complete = response.complete();
    c.finish_reason = FinishReasonName(response.complete().finish_reason());
    if (reasoning) {  // not streamed (ReasoningChunks streams): the block out of the text
      const ReasoningSplit s = SplitReasoning(c.text, ParserOf(c), /*final=*/true);
      if (s.content_begin > 0) {
        c.reasoning = c.text.substr(s.reasoning_begin, s.reasoning_end - s.reasoning_begin);
        c.text.erase(0, s.content_begin);
      }
    }
    if (tools) {
      json call = ToolCall(c.text);
      if (!call.is_null()) c.tool_calls = json::array({std::move(call)});
      // OpenAI: a named function's call ends with "stop", a "required" one with "tool_calls".
      if (!c.tool_calls.is_null() && c.finish_reason == "stop") {
        if (request_.tool_choice == ParsedRequest::ToolChoice::kRequired)
          c.finish_reason = "tool_calls";
      }
    }
    std::string content;  // auto: the text before the calls
    if (auto_tools) {
      c.tool_calls = AutoToolCalls(c.text, &content);
      if (!c.tool_calls.is_null()) {
        c.content = content.empty() ? json(nullptr) : json(content);
        c.finish_reason = "tool_calls";  // as vLLM, whenever calls were parsed
      }
    }
    if (!request_.stream) return {};
    if (auto_tools) {
      // What is left of the content (all of it when there are no calls), then the calls.
      const size_t end = c.tool_calls.is_null() ? c.text.size() : content.size();
      const std::string rest = end > c.sent ? c.text.substr(c.sent, end - c.sent) : "";
      c.sent = std::max(c.sent, end);
      const bool first = !c.started;
      c.started = true;
      std::vector<json> out;
      if (!rest.empty() || first) {
        json choice = ChoiceDelta(index, rest, nullptr, "", first);
        if (first && request_.prompt_logprobs) choice["prompt_logprobs"] = c.prompt_logprobs;
        out.push_back(ChunkObject(json::array({std::move(choice)})));
      }
      AppendCallsAndFinish(index, c, &out);
      return out;
    }
    if (!c.tool_calls.is_null()) {
      json call = c.tool_calls[0];
      call["index"] = 0;
      json delta = {{"role", "assistant"},
                    {"content", nullptr},
                    {"tool_calls", json::array({std::move(call)})}};
      json first = {{"index", index},
                    {"delta", std::move(delta)},
                    {"logprobs", c.logprobs},
                    {"finish_reason", nullptr}};
      if (request_.prompt_logprobs) first["prompt_logprobs"] = c.prompt_logprobs;
      c.started = true;
      return {ChunkObject(json::array({std::move(first)})),
              ChunkObject(json::array({ChoiceDelta(index, "", nullptr, c.finish_reason, false)}))};
    }
    const bool first = !c.started;
    const std::string text = first ? c.text : std::string();
    c.started = true;
    json choice = ChoiceDelta(index, text, nullptr, c.finish_reason, first);
    if (first && request_.prompt_logprobs) choice["prompt_logprobs"] = c.prompt_logprobs;
    return {ChunkObject(json::array({std::move(choice)}))};
  }
  // An in-band Error is followed by the call's failed status (OnFailure).
  return {};
}

std::string ResponseBuilder::OnResponse(int index, const v1::GenerateResponse& response) {
  std::string out;
  for (const json& chunk : Chunks(index, response)) out += Event(chunk);
  return out;
}

std::string ResponseBuilder::OnFailure(int /*index*/, const grpc::Status& status) {
  return request_.stream ? Event(ErrorBody(status)) : std::string();
}

json ResponseBuilder::Stats(int index) const { return TinyServeStats(choices_[index].complete); }

json ResponseBuilder::Usage() const {
  int64_t prompt = 0, completion = 0, cached = 0;
  for (size_t i = 0; i < choices_.size(); ++i) {
    const v1::Usage& u = choices_[i].complete.usage();
    completion += u.completion_tokens();
    // The n samples of one prompt count its prompt once.
    if (i % request_.n == 0) {
      prompt += u.prompt_tokens();
      cached += u.cached_tokens();
    }
  }
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

std::string ResponseBuilder::StreamEnd() {
  std::string out;
  if (request_.include_usage) {
    json last = ChunkObject(json::array());
    last["usage"] = Usage();
    out = Event(last);
  }
  return out + "data: [DONE]\n\n";
}

std::string ResponseBuilder::Body() const {
  return BodyJson().dump(-1, ' ', false, json::error_handler_t::replace);
}

json ResponseBuilder::BodyJson() const {
  json choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    json choice = {{"index", i}};
    if (request_.endpoint == Endpoint::kChat && !c.tool_calls.is_null()) {
      choice["message"] = {
          {"role", "assistant"}, {"content", c.content}, {"tool_calls", c.tool_calls}};
    } else if (request_.endpoint == Endpoint::kChat) {
      // With a reasoning block, an empty answer is null (vLLM's).
      choice["message"] = {
          {"role", "assistant"},
          {"content", c.reasoning.is_null() || !c.text.empty() ? json(c.text) : json(nullptr)}};
    } else {
      choice["text"] = c.text;
    }
    if (!c.reasoning.is_null()) choice["message"]["reasoning_content"] = c.reasoning;
    choice["logprobs"] = c.logprobs;
    if (request_.prompt_logprobs) choice["prompt_logprobs"] = c.prompt_logprobs;
    choice["finish_reason"] = c.finish_reason;
    choice["stop_reason"] = StopReason(c.complete);
    choice["tinyserve"] = TinyServeStats(c.complete);
    choices.push_back(std::move(choice));
  }
  json body = {
      {"id", id_},
      {"object", request_.endpoint == Endpoint::kChat ? "chat.completion" : "text_completion"},
      {"created", created_},
      {"model", request_.model},
      {"choices", std::move(choices)},
      {"usage", Usage()}};
  return body;
}

}  // namespace tinyserve::openai
