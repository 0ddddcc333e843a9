// File: worker/server/api_util.h
// Helpers shared by the worker and the router for the public API messages:
//   - Generate and Embed are served as raw (ByteBuffer) methods so that a request that protobuf
//     refuses to parse (proto3 rejects string fields holding malformed UTF-8) is answered with
//     INVALID_ARGUMENT naming the field, instead of gRPC's generic parse failure;
//   - UTF-8 checks and repair, because every string field we send must be valid UTF-8 (Python
//     and other strict clients refuse to parse it otherwise);
//   - messages <-> grpc::ByteBuffer.
// All functions are thread-safe (no shared state).
#pragma once

#include <string>
#include <string_view>

#include "google/protobuf/message.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/status.h"
#include "tinyserve/v1/tinyserve.pb.h"

namespace tinyserve {

// True if s is well-formed UTF-8 (no overlongs, surrogates or code points above U+10FFFF).
bool IsWellFormedUtf8(std::string_view s);
// s with every ill-formed sequence replaced by U+FFFD.
std::string SanitizeUtf8(std::string_view s);

// Parses a request message. On failure: INVALID_ARGUMENT naming the string field that holds
// malformed UTF-8 ("chat.messages[1].content is not valid UTF-8"), or saying the message is
// malformed.
grpc::Status ParseRequest(const grpc::ByteBuffer& buffer, google::protobuf::Message* request);

// Serializes a message into a ByteBuffer (one slice).
grpc::ByteBuffer ToByteBuffer(const google::protobuf::Message& message);
// Parses a ByteBuffer; false when it does not parse.
bool FromByteBuffer(const grpc::ByteBuffer& buffer, google::protobuf::Message* message);

// The call's deadline on the engine's clock (NowSeconds, GenerateRequest::deadline); 0: none.
double EngineDeadline(const grpc::CallbackServerContext& context);

// The gRPC code's canonical name, e.g. "INVALID_ARGUMENT".
const char* StatusCodeName(grpc::StatusCode code);

}  // namespace tinyserve
