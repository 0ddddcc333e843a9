#include "common/paths.h"

#include <sys/stat.h>

#include <cstdlib>

namespace tinyserve {

std::string DataDir() {
  if (const char* v = std::getenv("TINYSERVE_DATA"); v != nullptr && *v) return v;
  return "../shared/data";
}

std::string CacheDir() {
  if (const char* v = std::getenv("TINYSERVE_CACHE"); v != nullptr && *v) return v;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/tmp") + "/.cache/tinyserve";
}

std::string DefaultModelPath() { return CacheDir() + "/SmolLM2-135M-Instruct.Q4_1.gguf"; }

std::string Stories260kPath() { return DataDir() + "/models/stories260K/stories260K.gguf"; }

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace tinyserve
