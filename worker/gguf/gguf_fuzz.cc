// libFuzzer target for the GGUF reader: GgufFile::Parse must return a status for any input,
// never crash, hang or read out of bounds (ASan and UBSan check the last).
//
// Build and run (clang with libFuzzer; libclang-rt-14-dev on Debian 12):
//   cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
//         -DTINYSERVE_FUZZ=ON -DTINYSERVE_CUDA=OFF
//   cmake --build build-fuzz -j2 --target gguf_fuzz gguf_fuzz_seeds
//   build-fuzz/bin/gguf_fuzz_seeds build-fuzz/gguf_fuzz_corpus
//   build-fuzz/bin/gguf_fuzz -max_total_time=60 -max_len=16384 build-fuzz/gguf_fuzz_corpus
// ctest in that build also runs it briefly (gguf_fuzz_smoke: 20000 runs on the seeds).
#include <cstddef>
#include <cstdint>

#include "worker/gguf/gguf_file.h"
#include "worker/model/lora_adapter.h"

namespace {

// Base models a LoRA adapter is checked against: stories260K's shapes (llama, GQA) and a GPT-2.
tinyserve::ModelConfig Base(tinyserve::Arch arch) {
  tinyserve::ModelConfig c;
  c.arch = arch;
  c.n_layers = 5;
  c.dim = 64;
  c.n_heads = 8;
  c.n_kv_heads = arch == tinyserve::Arch::kGpt2 ? 8 : 4;
  c.head_dim = 8;
  c.ffn_dim = 172;
  c.vocab_size = 512;
  c.rope_style = arch == tinyserve::Arch::kGpt2 ? tinyserve::RopeStyle::kNone
                                                : tinyserve::RopeStyle::kAdjacent;
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = tinyserve::GgufFile::Parse(data, size);
  if (file.ok()) {
    // Touch every accessor so that a bad pointer or variant shows up here, not in a runner.
    const tinyserve::GgufFile& f = **file;
    for (const auto& [key, value] : f.metadata()) {
      (void)value.AsInt();
      (void)value.AsDouble();
      (void)f.GetStringArray(key);
      (void)f.GetFloatArray(key);
    }
    volatile uint8_t sink = 0;
    for (const auto& t : f.tensors()) {
      (void)t.NumElements();
      if (t.nbytes > 0) sink = sink ^ t.data[0] ^ t.data[t.nbytes - 1];
    }
    // As a LoRA adapter: refused with a status or accepted with pairs that fit the model.
    std::shared_ptr<const tinyserve::GgufFile> shared(std::move(*file));
    for (tinyserve::Arch arch : {tinyserve::Arch::kLlama, tinyserve::Arch::kGpt2}) {
      const tinyserve::ModelConfig base = Base(arch);
      auto lora = tinyserve::LoraAdapter::FromGguf("fuzz", "fuzz.gguf", shared, base);
      if (lora.ok() && ((*lora)->num_pairs() == 0 || (*lora)->max_rank() < 1)) __builtin_trap();
    }
  }
  return 0;
}
