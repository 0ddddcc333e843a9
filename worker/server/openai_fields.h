// File: worker/server/openai_fields.h
// Reading OpenAI-style JSON request bodies: typed reads of optional fields whose first error
// is an INVALID_ARGUMENT naming the field (with it as the kParamPayload), shared by
// openai_api.cc and openai_responses.cc. Internal to the HTTP frontend.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "worker/server/openai_api.h"

namespace tinyserve::openai {

// o[key] when it is a string, else "" (json::value would throw on another type).
inline std::string StringField(const Json& o, const char* key) {
  if (!o.is_object()) return "";
  auto it = o.find(key);
  return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
}

inline absl::Status Bad(absl::string_view field, absl::string_view message) {
  absl::Status s = absl::InvalidArgumentError(absl::StrCat(field, ": ", message));
  s.SetPayload(kParamPayload, absl::Cord(field));
  return s;
}

// Typed reads of a JSON object's optional fields; absent and null read as unset. The first
// type or range error is kept (later reads still return unset).
class Fields {
 public:
  Fields(const Json& object, std::string prefix) : o_(object), prefix_(std::move(prefix)) {}

  const Json* Get(const char* key) const {
    auto it = o_.find(key);
    return it == o_.end() || it->is_null() ? nullptr : &*it;
  }
  std::optional<double> Number(const char* key) {
    const Json* v = Get(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) return Fail(key, "must be a number");
    return v->get<double>();
  }
  std::optional<int64_t> Integer(const char* key, int64_t lo, int64_t hi) {
    const Json* v = Get(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number_integer()) return Fail(key, "must be an integer");
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi)) {
      return Fail(key, absl::StrCat("must be in [", lo, ", ", hi, "]"));
    }
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) {
      return Fail(key, absl::StrCat("must be in [", lo, ", ", hi, "], got ", x));
    }
    return x;
  }
  std::optional<bool> Bool(const char* key) {
    const Json* v = Get(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean()) return Fail(key, "must be true or false");
    return v->get<bool>();
  }
  std::optional<std::string> String(const char* key) {
    const Json* v = Get(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) return Fail(key, "must be a string");
    return v->get<std::string>();
  }
  // Fields we know and do not implement: accepted only at their neutral value.
  void RejectUnless(const char* key, bool neutral, absl::string_view why) {
    if (Get(key) != nullptr && !neutral) Fail(key, why);
  }

  std::nullopt_t Fail(absl::string_view key, absl::string_view message) {
    if (status_.ok()) status_ = Bad(absl::StrCat(prefix_, key), message);
    return std::nullopt;
  }
  const absl::Status& status() const { return status_; }

 private:
  const Json& o_;
  std::string prefix_;
  absl::Status status_;
};

// JSON text of a value (invalid UTF-8 replaced, as every response is written).
inline std::string Dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// Fields the APIs translated into chat (openai_responses.h, anthropic_api.h) pass through with
// chat's meaning: vLLM's sampling extras and TinyServe's selection.
inline constexpr const char* kChatExtras[] = {"model",
                                              "temperature",
                                              "top_p",
                                              "stream",
                                              "seed",
                                              "top_k",
                                              "min_p",
                                              "ignore_eos",
                                              "repetition_penalty",
                                              "min_tokens",
                                              "presence_penalty",
                                              "priority",
                                              "frequency_penalty",
                                              "cache_salt",
                                              "stop_token_ids",
                                              "request_id",
                                              "logit_bias",
                                              "selection",
                                              "structured_outputs",
                                              "guided_regex",
                                              "guided_choice",
                                              "guided_json",
                                              "guided_grammar",
                                              "grammar",
                                              "ebnf",
                                              "thinking_token_budget"};

// An INVALID_ARGUMENT from the chat parser with its field renamed by rename(field) (the
// message's leading field and the kParamPayload).
template <typename Rename>
absl::Status RenamedField(const absl::Status& st, Rename rename) {
  const auto payload = st.GetPayload(kParamPayload);
  if (!payload.has_value()) return st;
  const std::string field(*payload);
  const std::string renamed = rename(field);
  if (renamed == field) return st;
  std::string message(st.message());
  if (message.rfind(field, 0) == 0) message = renamed + message.substr(field.size());
  absl::Status out(st.code(), message);
  out.SetPayload(kParamPayload, absl::Cord(renamed));
  return out;
}

// field with the first of table's (chat prefix, new prefix) pairs it starts with replaced; a
// prefix matches a whole name ("stop" not "stop_token_ids"). Unchanged when none does.
template <size_t N>
std::string RenamePrefix(const std::string& field,
                         const std::pair<const char*, const char*> (&table)[N]) {
  for (const auto& [from, to] : table) {
    const std::string prefix = from;
    if (field.rfind(prefix, 0) != 0) continue;
    if (field.size() == prefix.size() || prefix.back() == '.' || field[prefix.size()] == '.' ||
        field[prefix.size()] == '[') {
      return to + field.substr(prefix.size());
    }
  }
  return field;
}

// A request parsed for another API, as the chat request its builder runs on.
inline ParsedRequest AsChatRequest(ParsedRequest r) {
  r.endpoint = Endpoint::kChat;
  return r;
}

// "tools[i].function.X" -> "tools[i].X" (the flat tool forms), else "".
inline std::string FlatToolField(const std::string& field) {
  const size_t end = field.find("].function.");
  if (field.rfind("tools[", 0) != 0 || end == std::string::npos) return "";
  return field.substr(0, end + 1) + field.substr(end + 10);
}

}  // namespace tinyserve::openai
