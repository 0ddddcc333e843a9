#include "worker/server/api_util.h"

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/unknown_field_set.h"

namespace tinyserve {
namespace {

using google::protobuf::UnknownField;
using google::protobuf::UnknownFieldSet;

// Length of the well-formed UTF-8 sequence at s[i], or 0 if ill-formed (Unicode 15, table 3-7).
size_t Utf8SequenceLength(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  const size_t left = s.size() - i;
  const uint8_t c = b(0);
  if (c < 0x80) return 1;
  auto cont = [&](size_t k, uint8_t lo = 0x80, uint8_t hi = 0xBF) {
    return k < left && b(k) >= lo && b(k) <= hi;
  };
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c == 0xE0) return cont(1, 0xA0) && cont(2) ? 3 : 0;
  if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) return cont(1) && cont(2) ? 3 : 0;
  if (c == 0xED) return cont(1, 0x80, 0x9F) && cont(2) ? 3 : 0;
  if (c == 0xF0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
  if (c >= 0xF1 && c <= 0xF3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
  if (c == 0xF4) return cont(1, 0x80, 0x8F) && cont(2) && cont(3) ? 4 : 0;
  return 0;
}

// Finds the first length-delimited field `number` in `set` that is not well-formed UTF-8.
// Returns its index among the fields with that number, or -1.
int FirstBadString(const UnknownFieldSet& set, int number) {
  int index = 0;
  for (int i = 0; i < set.field_count(); ++i) {
    const UnknownField& f = set.field(i);
    if (f.number() != number || f.type() != UnknownField::TYPE_LENGTH_DELIMITED) continue;
    if (!IsWellFormedUtf8(f.length_delimited())) return index;
    ++index;
  }
  return -1;
}

// Calls fn(sub-message set, index) for each length-delimited field `number` that parses.
template <typename Fn>
bool ForEachSubMessage(const UnknownFieldSet& set, int number, Fn fn) {
  int index = 0;
  for (int i = 0; i < set.field_count(); ++i) {
    const UnknownField& f = set.field(i);
    if (f.number() != number || f.type() != UnknownField::TYPE_LENGTH_DELIMITED) continue;
    UnknownFieldSet sub;
    if (sub.ParseFromString(f.length_delimited()) && fn(sub, index)) return true;
    ++index;
  }
  return false;
}

// Names the string field of a GenerateRequest (wire form) holding malformed UTF-8, or "".
// Field numbers follow tinyserve.proto.
std::string FindBadUtf8Field(const UnknownFieldSet& req) {
  if (FirstBadString(req, 1) >= 0) return "request_id";
  if (FirstBadString(req, 2) >= 0) return "text";
  std::string name;
  int message_index = 0;  // a repeated field's entries may be split over several chat fields
  ForEachSubMessage(req, 4, [&](const UnknownFieldSet& chat, int) {
    return ForEachSubMessage(chat, 1, [&](const UnknownFieldSet& msg, int) {
      const int i = message_index++;
      if (FirstBadString(msg, 1) >= 0) name = absl::StrCat("chat.messages[", i, "].role");
      if (FirstBadString(msg, 2) >= 0) name = absl::StrCat("chat.messages[", i, "].content");
      return !name.empty();
    });
  });
  if (!name.empty()) return name;
  ForEachSubMessage(req, 5, [&](const UnknownFieldSet& sampling, int) {
    const int i = FirstBadString(sampling, 8);
    if (i >= 0) name = absl::StrCat("sampling.stop[", i, "]");
    return !name.empty();
  });
  if (!name.empty()) return name;
  ForEachSubMessage(req, 6, [&](const UnknownFieldSet& selection, int) {
    if (FirstBadString(selection, 1) >= 0) {
      name = "selection.policy";
      return true;
    }
    return ForEachSubMessage(selection, 7, [&](const UnknownFieldSet& entry, int) {
      if (FirstBadString(entry, 1) >= 0 || FirstBadString(entry, 2) >= 0) {
        name = "selection.params";
      }
      return !name.empty();
    });
  });
  return name;
}

}  // namespace

bool IsWellFormedUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8SequenceLength(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string SanitizeUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8SequenceLength(s, i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
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

grpc::Status ParseGenerateRequest(const grpc::ByteBuffer& buffer,
                                  tinyserve::v1::GenerateRequest* request) {
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
    const std::string field = FindBadUtf8Field(wire);
    if (!field.empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat(field, " is not valid UTF-8"));
    }
  }
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      "request: not a valid tinyserve.v1.GenerateRequest");
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
