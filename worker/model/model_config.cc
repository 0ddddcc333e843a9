#include "worker/model/model_config.h"

namespace tinyserve {

const char* ArchName(Arch arch) {
  switch (arch) {
    case Arch::kLlama: return "llama";
    case Arch::kGpt2: return "gpt2";
  }
  return "unknown";
}

std::string ArchName(const ModelConfig& c) {
  return c.variant.empty() ? ArchName(c.arch) : c.variant;
}

}  // namespace tinyserve
