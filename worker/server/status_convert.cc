#include "worker/server/status_convert.h"

#include <string>

namespace tinyserve {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share their numeric values (0..16).
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(status.code())),
                      std::string(status.message()));
}

}  // namespace tinyserve
