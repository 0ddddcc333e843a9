// File: worker/server/status_convert.h
// The one place where absl::Status (the engine's error channel) and grpc::Status (what an RPC
// finishes with) become each other. The codes match one to one (Abseil's StatusCode values are
// gRPC's), so the conversions keep the code and the message; payloads are dropped.
#pragma once

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace tinyserve {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status ToAbslStatus(const grpc::Status& status);

}  // namespace tinyserve
