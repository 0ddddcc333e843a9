// File: common/paths.h
// Where the project finds its data. One setting each, so tests, tools and scripts agree:
//   TINYSERVE_DATA   shared test data (default: ../shared/data from the source root, i.e. the
//                    current directory when tests run)
//   TINYSERVE_CACHE  downloads such as the default model (default: ~/.cache/tinyserve)
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace tinyserve {

std::string DataDir();
std::string CacheDir();
// The default model: SmolLM2-135M-Instruct Q4_1 GGUF in the cache (see scripts/fetch-model).
std::string DefaultModelPath();
// stories260K.gguf under DataDir().
std::string Stories260kPath();
bool FileExists(const std::string& path);
// The bytes of a regular file of at most `max_bytes`. A FIFO, device or folder is refused
// (InvalidArgument) without blocking on it or reading it; NotFound when the path is absent.
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, int64_t max_bytes);

}  // namespace tinyserve
