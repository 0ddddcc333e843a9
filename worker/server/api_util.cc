#include "worker/server/api_util.h"

#include <chrono>
#include <cstdint>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/timer.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/unknown_field_set.h"

namespace tinyserve {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::UnknownField;
using google::protobuf::UnknownFieldSet;

// The bytes at s[i] that begin a well-formed UTF-8 sequence (Unicode 15, table 3-7): all of it
// (*complete), or its maximal subpart, at least one byte, which one U+FFFD replaces (Unicode's
// recommended practice, as Python, Rust's from_utf8_lossy and WHATWG decoders do).
size_t Utf8Prefix(std::string_view s, size_t i, bool* complete) {
  const uint8_t c = static_cast<uint8_t>(s[i]);
  *complete = true;
  if (c < 0x80) return 1;
  size_t n = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // the second byte's range
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c == 0xE0) {
    n = 3, lo = 0xA0;
  } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
    n = 3;
  } else if (c == 0xED) {
    n = 3, hi = 0x9F;
  } else if (c == 0xF0) {
    n = 4, lo = 0x90;
  } else if (c >= 0xF1 && c <= 0xF3) {
    n = 4;
  } else if (c == 0xF4) {
    n = 4, hi = 0x8F;
  } else {
    *complete = false;
    return 1;
  }
  size_t k = 1;
  for (; k < n && i + k < s.size(); ++k) {
    const uint8_t b = static_cast<uint8_t>(s[i + k]);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) break;
  }
  *complete = k == n;
  return k;
}

// The path of the first string field in `set` (the wire form of a `type` message) holding
// malformed UTF-8, e.g. "chat.messages[2].content"; a map names just its field. "" if none.
// A singular message field given more than once is merged first, as protobuf parses it.
std::string FindBadUtf8Field(const Descriptor* type, const UnknownFieldSet& set) {
  std::map<int, int> seen;              // field number -> its entries so far (repeated index)
  std::map<int, std::string> singular;  // singular message fields: their merged wire bytes
  auto inner = [](const FieldDescriptor* field, const std::string& bytes) -> std::string {
    UnknownFieldSet sub;
    return sub.ParseFromString(bytes) ? FindBadUtf8Field(field->message_type(), sub) : "";
  };
  for (int i = 0; i < set.field_count(); ++i) {
    const UnknownField& f = set.field(i);
    const FieldDescriptor* field = type->FindFieldByNumber(f.number());
    if (field == nullptr || f.type() != UnknownField::TYPE_LENGTH_DELIMITED) continue;
    const int index = seen[f.number()]++;
    std::string name = field->name();
    if (field->is_repeated() && !field->is_map()) absl::StrAppend(&name, "[", index, "]");
    if (field->type() == FieldDescriptor::TYPE_STRING) {
      if (!IsWellFormedUtf8(f.length_delimited())) return name;
    } else if (field->type() == FieldDescriptor::TYPE_MESSAGE && !field->is_repeated()) {
      singular[f.number()] += f.length_delimited();
    } else if (field->type() == FieldDescriptor::TYPE_MESSAGE) {
      const std::string bad = inner(field, f.length_delimited());
      if (!bad.empty()) return field->is_map() ? name : absl::StrCat(name, ".", bad);
    }
  }
  for (const auto& [number, bytes] : singular) {
    const FieldDescriptor* field = type->FindFieldByNumber(number);
    const std::string bad = inner(field, bytes);
    if (!bad.empty()) return absl::StrCat(field->name(), ".", bad);
  }
  return "";
}

}  // namespace

bool IsWellFormedUtf8(std::string_view s) {
  bool complete = true;
  for (size_t i = 0; i < s.size() && complete;) i += Utf8Prefix(s, i, &complete);
  return complete;
}

std::string SanitizeUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    bool complete;
    const size_t n = Utf8Prefix(s, i, &complete);
    if (complete) {
      out.append(s.substr(i, n));
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
    }
    i += n;
  }
  return out;
}

grpc::ByteBuffer ToByteBuffer(const google::protobuf::Message& message) {
  std::string bytes = message.SerializeAsString();
  grpc::Slice slice(std::move(bytes));
  return grpc::ByteBuffer(&slice, 1);
}

bool FromByteBuffer(const grpc::ByteBuffer& buffer, google::protobuf::Message* message) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return false;
  std::string bytes;
  bytes.reserve(buffer.Length());
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return message->ParseFromString(bytes);
}

grpc::Status ParseRequest(const grpc::ByteBuffer& buffer, google::protobuf::Message* request) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "request: unreadable message");
  }
  std::string bytes;
  bytes.reserve(buffer.Length());
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  if (request->ParseFromString(bytes)) return grpc::Status::OK;
  UnknownFieldSet wire;
  if (wire.ParseFromString(bytes)) {
    const std::string field = FindBadUtf8Field(request->GetDescriptor(), wire);
    if (!field.empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat(field, " is not valid UTF-8"));
    }
  }
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      absl::StrCat("request: not a valid ", request->GetDescriptor()->full_name()));
}

double EngineDeadline(const grpc::CallbackServerContext& context) {
  const auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return 0;
  return NowSeconds() +
         std::chrono::duration<double>(deadline - std::chrono::system_clock::now()).count();
}

const char* StatusCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "UNKNOWN";
  }
}

}  // namespace tinyserve
