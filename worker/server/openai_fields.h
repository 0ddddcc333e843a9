// File: worker/server/openai_fields.h
// Reading OpenAI-style JSON request bodies: typed reads of optional fields whose first error
// is an INVALID_ARGUMENT naming the field (with it as the kParamPayload), shared by
// openai_api.cc and openai_responses.cc. Internal to the HTTP frontend.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

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

}  // namespace tinyserve::openai
