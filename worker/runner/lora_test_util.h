// File: worker/runner/lora_test_util.h
// Test-only: random LoRA updates of a model's projections and llama.cpp's GGUF adapter file
// holding them (lora_test, tp_test).
#pragma once

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/fp16.h"
#include "gtest/gtest.h"
#include "worker/gguf/gguf_test_util.h"
#include "worker/model/model_config.h"

namespace tinyserve::lora_testing {

using testing_gguf::GgufBuilder;

struct Update {
  std::string weight;  // base weight name
  int64_t in = 0, out = 0, r = 0;
  std::vector<float> a, b;         // [r][in], [out][r]
  GgmlType type = GgmlType::kF32;  // stored type (F32 or F16)
};

inline std::vector<uint8_t> Bytes(const std::vector<float>& v, GgmlType type) {
  std::vector<uint8_t> out;
  for (float x : v) {
    if (type == GgmlType::kF16) {
      const fp16_t h = FloatToFp16(x);
      out.push_back(static_cast<uint8_t>(h & 0xFF));
      out.push_back(static_cast<uint8_t>(h >> 8));
    } else {
      uint8_t b[4];
      std::memcpy(b, &x, 4);
      out.insert(out.end(), b, b + 4);
    }
  }
  return out;
}

// Random updates of every projection of every layer (rank r), values rounded to what the
// stored type holds so that the merged reference uses the same numbers.
inline std::vector<Update> RandomUpdates(const ModelConfig& c, int r, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int64_t D = c.dim, qd = int64_t{c.n_heads} * c.head_dim,
                kd = int64_t{c.n_kv_heads} * c.head_dim, F = c.ffn_dim;
  std::vector<std::tuple<const char*, int64_t, int64_t>> shapes = {
      {"attn_q", D, qd},  {"attn_k", D, kd}, {"attn_v", D, kd}, {"attn_output", qd, D},
      {"ffn_gate", D, F}, {"ffn_up", D, F},  {"ffn_down", F, D}};
  if (c.arch == Arch::kGpt2)
    shapes = {
        {"attn_qkv", D, qd + 2 * kd}, {"attn_output", qd, D}, {"ffn_up", D, F}, {"ffn_down", F, D}};
  std::vector<Update> ups;
  for (int l = 0; l < c.n_layers; ++l)
    for (const auto& [what, in, out] : shapes) {
      Update up;
      up.weight = "blk." + std::to_string(l) + "." + what + ".weight";
      up.in = in, up.out = out, up.r = r;
      up.type = std::string(what).rfind("attn", 0) == 0 ? GgmlType::kF16 : GgmlType::kF32;
      auto fill = [&](std::vector<float>* v, int64_t n, float scale) {
        for (int64_t i = 0; i < n; ++i) {
          float x = scale * u(rng);
          if (up.type == GgmlType::kF16) x = Fp16ToFloat(FloatToFp16(x));
          v->push_back(x);
        }
      };
      fill(&up.a, r * in, 1.0f / std::sqrt(static_cast<float>(in)));
      fill(&up.b, out * r, 0.5f / std::sqrt(static_cast<float>(r)));
      ups.push_back(std::move(up));
    }
  return ups;
}

inline std::string WriteAdapter(const std::string& file, const std::vector<Update>& ups,
                                float alpha, const std::string& arch = "llama") {
  GgufBuilder b;
  b.AddString("general.architecture", arch);
  b.AddString("general.type", "adapter");
  b.AddString("adapter.type", "lora");
  if (alpha >= 0) b.AddF32("adapter.lora.alpha", alpha);  // < 0: absent
  for (const Update& up : ups) {
    b.AddTensor(up.weight + ".lora_a", up.type,
                {static_cast<uint64_t>(up.in), static_cast<uint64_t>(up.r)}, Bytes(up.a, up.type));
    b.AddTensor(up.weight + ".lora_b", up.type,
                {static_cast<uint64_t>(up.r), static_cast<uint64_t>(up.out)}, Bytes(up.b, up.type));
  }
  const std::string path = ::testing::TempDir() + "/" + file;
  EXPECT_TRUE(testing_gguf::WriteFile(path, b.Build()));
  return path;
}

}  // namespace tinyserve::lora_testing
