// Writes a small seed corpus for gguf_fuzz into the directory given as argv[1]: well-formed
// files from the test writer (a tiny llama of mixed tensor types, one with nested arrays and
// every value type, one with a 64-byte alignment) and the stories260K header if it is found.
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/paths.h"
#include "worker/gguf/gguf_test_util.h"

namespace tg = tinyserve::testing_gguf;
using tinyserve::GgmlType;
using tinyserve::GgufValueType;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  ::mkdir(dir.c_str(), 0755);
  bool ok = tg::WriteFile(dir + "/tiny_llama.gguf", tg::TinyLlama().Build());

  // A LoRA adapter for gguf_fuzz's stories260K-shaped base (dim 64, 4 KV heads of 8).
  tg::GgufBuilder lora;
  lora.AddString("general.architecture", "llama");
  lora.AddString("general.type", "adapter");
  lora.AddString("adapter.type", "lora");
  lora.AddF32("adapter.lora.alpha", 8);
  lora.AddTensor("blk.0.attn_k.weight.lora_a", GgmlType::kF32, {64, 2},
                 std::vector<uint8_t>(64 * 2 * 4, 0));
  lora.AddTensor("blk.0.attn_k.weight.lora_b", GgmlType::kF16, {2, 32},
                 std::vector<uint8_t>(2 * 32 * 2, 0));
  ok = ok && tg::WriteFile(dir + "/lora.gguf", lora.Build());

  tg::GgufBuilder values;
  values.AddU8("u8", 1);
  values.AddI16("i16", -2);
  values.AddU64("u64", 3);
  values.AddF64("f64", 0.5);
  values.AddBool("b", true);
  values.AddArray<float>("fa", GgufValueType::kF32, {1, 2});
  tg::ByteWriter w;
  w.Put<uint32_t>(tg::Code(GgufValueType::kArray));
  w.Put<uint64_t>(1);
  w.Put<uint32_t>(tg::Code(GgufValueType::kString));
  w.Put<uint64_t>(1);
  w.PutString("x");
  values.AddRaw("nested", tg::Code(GgufValueType::kArray), w.bytes());
  values.AddTensor("k", GgmlType::kQ4_K, {256});
  values.AddTensor("s", GgmlType::kQ6_K, {256, 1});
  ok = ok && tg::WriteFile(dir + "/values.gguf", values.Build());

  tg::GgufBuilder aligned;
  aligned.AddU32("general.alignment", 64);
  aligned.alignment = 64;
  aligned.AddTensor("a", GgmlType::kF32, {3});
  aligned.AddTensor("b", GgmlType::kF16, {5, 2});
  ok = ok && tg::WriteFile(dir + "/aligned.gguf", aligned.Build());

  // The stories260K header and its first tensor (the tensor offsets fail past it, which is
  // fine: the fuzzer explores the metadata and tensor-info parsing from there).
  std::ifstream f(tinyserve::Stories260kPath(), std::ios::binary);
  if (f) {
    std::vector<uint8_t> bytes(std::istreambuf_iterator<char>(f), {});
    if (bytes.size() > 16384) bytes.resize(16384);
    ok = ok && tg::WriteFile(dir + "/stories260k_head.gguf", bytes);
  }
  if (!ok) std::fprintf(stderr, "could not write the corpus to %s\n", dir.c_str());
  return ok ? 0 : 1;
}
