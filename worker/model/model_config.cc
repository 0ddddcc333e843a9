#include "worker/model/model_config.h"

namespace tinyserve {

const char* ArchName(Arch arch) {
  switch (arch) {
    case Arch::kLlama: return "llama";
    case Arch::kGpt2: return "gpt2";
  }
  return "unknown";
}

}  // namespace tinyserve
