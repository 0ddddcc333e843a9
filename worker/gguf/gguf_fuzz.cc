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
  }
  return 0;
}
