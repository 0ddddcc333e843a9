// File: common/paths.h
// Where the project finds its data. One setting each, so tests, tools and scripts agree:
//   TINYSERVE_DATA   shared test data (default: ../shared/data from the source root, i.e. the
//                    current directory when tests run)
//   TINYSERVE_CACHE  downloads such as the default model (default: ~/.cache/tinyserve)
#pragma once

#include <string>

namespace tinyserve {

std::string DataDir();
std::string CacheDir();
// The default model: SmolLM2-135M-Instruct Q4_1 GGUF in the cache (see scripts/fetch-model).
std::string DefaultModelPath();
// stories260K.gguf under DataDir().
std::string Stories260kPath();
bool FileExists(const std::string& path);

}  // namespace tinyserve
