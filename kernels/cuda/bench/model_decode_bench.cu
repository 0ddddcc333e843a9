// Decode through DeviceModel (the engine's GPU path) for a SmolLM2-135M-shaped model (30 layers,
// dim 576, 9/3 heads, d 64, ffn 1536, vocab 49152) with random weights: the prompt is a real
// chunked prefill (512 tokens per Forward), then `steps` decode steps timed end to end (host
// step building, graph replay, logits copy-back included). Modes: dense, quest (budget 1024,
// dense_layers 2), and quest with the tiered KV cache (device slots per layer = batch * 2 *
// budget pages, so selections fit) reporting hit rate and bytes moved per step.
// Writes JSON lines to --out.
//
// Usage: cuda_model_decode_bench --out FILE [--context 8000] [--batches 1,8] [--steps 32]
//                                [--max-seconds S]   (no new configuration starts after S)
//                                [--smoke]  (2 layers, vocab 512, budget 64: the code paths at a
//                                            size the CPU CUDA emulator runs in CI)
// Exits 1 when a configuration fails.
#include <chrono>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/cuda/bench/bench_util.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/device_model.h"

namespace tinyserve::cuda::bench {
namespace {

DeviceModelConfig Shape(int context, int batch, bool smoke) {
  DeviceModelConfig c;
  c.n_layers = smoke ? 2 : 30;
  c.dim = 576;
  c.n_heads = 9;
  c.n_kv_heads = 3;
  c.head_dim = 64;
  c.ffn_dim = 1536;
  c.vocab = smoke ? 512 : 49152;
  c.rope_theta = 100000.f;
  c.rope_adjacent = true;
  c.page_size = 16;
  c.max_pages_per_seq = (context + 64 + 15) / 16;
  c.num_pages = c.max_pages_per_seq * batch;
  c.max_batch = batch;
  c.max_tokens = 512 + batch;
  return c;
}

bool Load(DeviceModel& m, const DeviceModelConfig& c) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::string err;
  auto set = [&](WeightSlot s, int l, int64_t rows, int64_t cols, bool norm) {
    std::vector<float> w(size_t(rows * cols));
    const float scale = norm ? 0.f : 1.7f / std::sqrt(float(cols));
    for (float& x : w) x = norm ? 1.f + 0.1f * u(rng) : scale * u(rng);
    if (!m.SetWeight(s, l, w.data(), int64_t(w.size()), &err)) {
      std::fprintf(stderr, "SetWeight: %s\n", err.c_str());
      return false;
    }
    return true;
  };
  const int64_t D = c.dim, q = c.n_heads * c.head_dim, k = c.n_kv_heads * c.head_dim, F = c.ffn_dim;
  bool ok = set(WeightSlot::kEmbedding, 0, c.vocab, D, false) &&
            set(WeightSlot::kOutputNorm, 0, 1, D, true) && set(WeightSlot::kLmHead, 0, c.vocab, D, false);
  for (int l = 0; ok && l < c.n_layers; ++l)
    ok = set(WeightSlot::kAttnNorm, l, 1, D, true) && set(WeightSlot::kWq, l, q, D, false) &&
         set(WeightSlot::kWk, l, k, D, false) && set(WeightSlot::kWv, l, k, D, false) &&
         set(WeightSlot::kWo, l, D, q, false) && set(WeightSlot::kFfnNorm, l, 1, D, true) &&
         set(WeightSlot::kWgate, l, F, D, false) && set(WeightSlot::kWup, l, F, D, false) &&
         set(WeightSlot::kWdown, l, D, F, false);
  return ok;
}

bool Run(JsonLines& out, int context, int batch, int steps, const char* mode, bool smoke) {
  const bool quest = std::string(mode) != "dense", tiered = std::string(mode) == "quest-tiered";
  const int budget = smoke ? 64 : 1024;
  DeviceModelConfig c = Shape(context, batch, smoke);
  if (tiered) {
    c.device_pages = batch * c.n_kv_heads * (budget / c.page_size);
    c.resident_layers = smoke ? 1 : 2;  // the dense layers stay on the device
  }
  std::string err;
  auto m = DeviceModel::Create(c, &err);
  if (!m || !Load(*m, c)) {
    std::fprintf(stderr, "%s: %s\n", mode, err.c_str());
    return false;
  }
  std::mt19937 rng(2);
  std::uniform_int_distribution<int> tok(0, c.vocab - 1);
  std::vector<std::vector<int32_t>> tokens(batch), pages(batch);
  for (int b = 0; b < batch; ++b) {
    // The decode loop runs steps + 2 steps (an eager step and a capture first).
    for (int i = 0; i < context + steps + 2; ++i) tokens[b].push_back(tok(rng));
    for (int p = 0; p < c.max_pages_per_seq; ++p) pages[b].push_back(b * c.max_pages_per_seq + p);
  }
  DeviceAttention att;
  att.quest = quest;
  att.budget_pages = budget / c.page_size;
  att.dense_layers = smoke ? 1 : 2;
  std::vector<float> logits;
  auto seq = [&](int b, int64_t pos, int n) {
    DeviceSeq s;
    s.tokens = tokens[b].data() + pos;
    s.n = n;
    s.start_pos = pos;
    s.pages = pages[b].data();
    s.n_pages = int(pages[b].size());
    s.attention = att;
    return s;
  };
  // Prefill: one sequence at a time, 512-token chunks.
  for (int b = 0; b < batch; ++b)
    for (int pos = 0; pos < context; pos += 512)
      if (!m->Forward({seq(b, pos, std::min(512, context - pos))}, &logits, &err)) {
        std::fprintf(stderr, "prefill: %s\n", err.c_str());
        return false;
      }
  DeviceStepStats sum;
  double seconds = 0;
  for (int s = 0; s < steps + 2; ++s) {
    std::vector<DeviceSeq> step;
    for (int b = 0; b < batch; ++b) step.push_back(seq(b, context + s, 1));
    const auto t0 = std::chrono::steady_clock::now();
    if (!m->Forward(step, &logits, &err)) {
      std::fprintf(stderr, "decode: %s\n", err.c_str());
      return false;
    }
    if (s < 2) continue;  // eager run and graph capture
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const DeviceStepStats& st = m->last_stats();
    sum.pages_attended += st.pages_attended;
    sum.pages_total += st.pages_total;
    sum.tier_hits += st.tier_hits;
    sum.tier_misses += st.tier_misses;
    sum.bytes_moved += st.bytes_moved;
    sum.bytes_direct += st.bytes_direct;
  }
  const double hit = sum.tier_hits + sum.tier_misses > 0
                         ? double(sum.tier_hits) / double(sum.tier_hits + sum.tier_misses) : -1;
  out.Write("{\"kind\":\"model_decode\",\"model\":\"smollm2-135m-shape-random-f16\",\"mode\":\"%s\","
            "\"batch\":%d,\"context\":%d,\"budget\":%d,\"steps\":%d,\"ms_per_step\":%.4f,"
            "\"tok_per_s\":%.1f,\"pages_attended_frac\":%.4f,\"device_pages\":%d,"
            "\"tier_hit_rate\":%.4f,\"bytes_moved_per_step\":%.0f,\"bytes_direct_per_step\":%.0f}",
            mode, batch, context, quest ? budget : 0, steps, 1000 * seconds / steps,
            batch * steps / seconds, double(sum.pages_attended) / double(std::max<int64_t>(1, sum.pages_total)),
            c.device_pages, hit, double(sum.bytes_moved) / steps, double(sum.bytes_direct) / steps);
  return true;
}

}  // namespace
}  // namespace tinyserve::cuda::bench

int main(int argc, char** argv) {
  using namespace tinyserve::cuda;
  using namespace tinyserve::cuda::bench;
  if (!HaveDevice()) return 2;
  JsonLines out(Arg(argc, argv, "--out"));
  const std::string cs = Arg(argc, argv, "--context"), ss = Arg(argc, argv, "--steps");
  const int context = cs.empty() ? 8000 : std::atoi(cs.c_str());
  const int steps = ss.empty() ? 32 : std::atoi(ss.c_str());
  const bool smoke = Flag(argc, argv, "--smoke");
  const Deadline deadline(argc, argv);
  bool ok = true;
  for (int b : IntList(Arg(argc, argv, "--batches"), {1, 8}))
    for (const char* mode : {"dense", "quest", "quest-tiered"}) {
      if (deadline.Passed()) {
        std::fprintf(stderr, "time limit reached; stopping\n");
        return ok ? 0 : 1;
      }
      ok = Run(out, context, b, steps, mode, smoke) && ok;
    }
  return ok ? 0 : 1;
}
