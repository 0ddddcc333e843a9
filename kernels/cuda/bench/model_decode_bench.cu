// Decode through DeviceModel (the engine's GPU path: host step building, CUDA graph replay, logits
// copied back, all timed end to end) for a model with random f16 weights of one of two shapes:
//   smollm2    SmolLM2-135M: 30 layers, dim 576, 9/3 heads, d 64, ffn 1536, vocab 49152;
//              Quest budget 1024 tokens
//   tinyllama  TinyLlama-1.1B: 22 layers, dim 2048, 32/4 heads, d 64, ffn 5632, vocab 32000;
//              Quest budget 2048 tokens
// Each sequence's context is either a real chunked prefill (512 tokens per Forward) or, with
// --fill random, random keys and values written straight into the cache (DeviceModel::
// FillKvRandom; a real 32K prefill of the larger shape would take most of the time budget). Then
// `steps` decode steps per mode: dense, quest (the first 2 layers dense), and quest with the
// tiered KV cache (device slots per tiered layer: batch x KV heads x budget pages, so selections
// fit), which reports its hit rate and bytes moved per step. Dense and quest share one model and
// one filled cache per (batch, context); the tiered mode has its own.
// Writes JSON lines to --out.
//
// Usage: cuda_model_decode_bench --out FILE [--shape smollm2|tinyllama] [--contexts 8000]
//                                [--batches 1,8] [--steps 32] [--modes dense,quest,quest-tiered]
//                                [--fill prefill|random] [--budget TOKENS]
//                                [--max-seconds S]   (no new configuration starts after S)
//                                [--smoke]  (2 layers, vocab 512, budget 64: the code paths at a
//                                            size the CPU CUDA emulator runs in CI)
// Exits 1 when a configuration fails.
#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "kernels/cuda/bench/bench_util.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/device_model.h"
#include "kernels/cuda/random_fill.cuh"

namespace tinyserve::cuda::bench {
namespace {

struct Options {
  std::string shape = "smollm2", fill = "prefill";
  std::vector<int> contexts, batches;
  std::vector<std::string> modes;
  int steps = 32, budget = 0, dense_layers = 2;
  bool smoke = false;
};

DeviceModelConfig Shape(const Options& o, int max_context, int max_batch, bool tiered) {
  DeviceModelConfig c;
  if (o.shape == "tinyllama") {
    c.n_layers = 22;
    c.dim = 2048;
    c.n_heads = 32;
    c.n_kv_heads = 4;
    c.ffn_dim = 5632;
    c.vocab = 32000;
    c.rope_theta = 10000.f;
  } else {
    c.n_layers = 30;
    c.dim = 576;
    c.n_heads = 9;
    c.n_kv_heads = 3;
    c.ffn_dim = 1536;
    c.vocab = 49152;
    c.rope_theta = 100000.f;
    c.rope_adjacent = true;
  }
  c.head_dim = 64;
  if (o.smoke) {
    c.n_layers = 2;
    c.vocab = 512;
  }
  c.page_size = 16;
  // The decode loop appends steps + 2 tokens (an eager step and a capture first).
  c.max_pages_per_seq = (max_context + o.steps + 2 + 15) / 16;
  c.num_pages = c.max_pages_per_seq * max_batch;
  c.max_batch = max_batch;
  c.max_tokens = 512 + max_batch;
  if (tiered) {
    c.device_pages = max_batch * c.n_kv_heads * (o.budget / c.page_size);
    c.resident_layers = o.dense_layers;  // the dense layers stay on the device
  }
  return c;
}

// Random weights scaled by 1.7/sqrt(fan_in) (norm weights ~1), from a hash of (tensor, index),
// made on all host threads (the 1.1B shape has 1.1G of them).
bool Load(DeviceModel& m, const DeviceModelConfig& c, std::string* err) {
  uint64_t tensor = 1;
  std::vector<float> w;
  const int64_t n_threads = std::max(1u, std::thread::hardware_concurrency());
  auto set = [&](WeightSlot s, int l, int64_t rows, int64_t cols, bool norm) {
    w.resize(size_t(rows * cols));
    const float scale = norm ? 0.1f : 1.7f / std::sqrt(float(cols));
    const int64_t n = int64_t(w.size());
    auto fill = [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        w[i] = (norm ? 1.f : 0.f) + scale * HashUniform(tensor, i);
    };
    std::vector<std::thread> threads;
    for (int64_t t = 1; t < n_threads; ++t)
      threads.emplace_back(fill, n * t / n_threads, n * (t + 1) / n_threads);
    fill(0, n / n_threads);
    for (std::thread& t : threads) t.join();
    ++tensor;
    return m.SetWeight(s, l, w.data(), n, err);
  };
  const int64_t D = c.dim, q = c.n_heads * c.head_dim, k = c.n_kv_heads * c.head_dim, F = c.ffn_dim;
  bool ok = set(WeightSlot::kEmbedding, 0, c.vocab, D, false) &&
            set(WeightSlot::kOutputNorm, 0, 1, D, true) &&
            set(WeightSlot::kLmHead, 0, c.vocab, D, false);
  for (int l = 0; ok && l < c.n_layers; ++l)
    ok = set(WeightSlot::kAttnNorm, l, 1, D, true) && set(WeightSlot::kWq, l, q, D, false) &&
         set(WeightSlot::kWk, l, k, D, false) && set(WeightSlot::kWv, l, k, D, false) &&
         set(WeightSlot::kWo, l, D, q, false) && set(WeightSlot::kFfnNorm, l, 1, D, true) &&
         set(WeightSlot::kWgate, l, F, D, false) && set(WeightSlot::kWup, l, F, D, false) &&
         set(WeightSlot::kWdown, l, D, F, false);
  return ok;
}

// One model and its batch's sequences: token streams and page tables.
struct Bench {
  explicit Bench(const Options& options) : o(options) {}
  const Options& o;
  std::unique_ptr<DeviceModel> m;
  std::vector<std::vector<int32_t>> tokens, pages;

  bool Init(int max_context, int batch, bool tiered) {
    const DeviceModelConfig c = Shape(o, max_context, batch, tiered);
    std::string err;
    m = DeviceModel::Create(c, &err);
    if (!m || !Load(*m, c, &err)) {
      std::fprintf(stderr, "model: %s\n", err.c_str());
      return false;
    }
    std::mt19937 rng(2);
    std::uniform_int_distribution<int> tok(0, c.vocab - 1);
    tokens.assign(batch, {});
    pages.assign(batch, {});
    for (int b = 0; b < batch; ++b) {
      for (int i = 0; i < max_context + o.steps + 2; ++i) tokens[b].push_back(tok(rng));
      for (int p = 0; p < c.max_pages_per_seq; ++p) pages[b].push_back(b * c.max_pages_per_seq + p);
    }
    return true;
  }

  DeviceSeq Seq(int b, int64_t pos, int n, const DeviceAttention& att) const {
    DeviceSeq s;
    s.tokens = tokens[b].data() + pos;
    s.n = n;
    s.start_pos = pos;
    s.pages = pages[b].data();
    s.n_pages = int(pages[b].size());
    s.attention = att;
    return s;
  }

  // Every sequence's first `context` positions: a real prefill or random K/V.
  bool Fill(int context) {
    std::string err;
    std::vector<float> logits;
    for (int b = 0; b < int(tokens.size()); ++b) {
      if (o.fill == "random") {
        if (!m->FillKvRandom(pages[b].data(), int(pages[b].size()), context, b + 1, &err)) {
          std::fprintf(stderr, "fill: %s\n", err.c_str());
          return false;
        }
        continue;
      }
      for (int pos = 0; pos < context; pos += 512)
        if (!m->Forward({Seq(b, pos, std::min(512, context - pos), {})}, &logits, &err)) {
          std::fprintf(stderr, "prefill: %s\n", err.c_str());
          return false;
        }
    }
    return true;
  }

  bool Decode(JsonLines& out, int context, const std::string& mode) {
    const bool quest = mode != "dense";
    const DeviceModelConfig& c = m->config();
    const int batch = int(tokens.size());
    DeviceAttention att;
    att.quest = quest;
    att.budget_pages = o.budget / c.page_size;
    att.dense_layers = o.dense_layers;
    std::string err;
    std::vector<float> logits;
    DeviceStepStats sum;
    double seconds = 0;
    for (int s = 0; s < o.steps + 2; ++s) {
      std::vector<DeviceSeq> step;
      for (int b = 0; b < batch; ++b) step.push_back(Seq(b, context + s, 1, att));
      const auto t0 = std::chrono::steady_clock::now();
      if (!m->Forward(step, &logits, &err)) {
        std::fprintf(stderr, "decode %s: %s\n", mode.c_str(), err.c_str());
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
                           ? double(sum.tier_hits) / double(sum.tier_hits + sum.tier_misses)
                           : -1;
    out.Write(
        "{\"kind\":\"model_decode\",\"model\":\"%s-shape-random-f16\",\"kv_fill\":\"%s\","
        "\"mode\":\"%s\",\"batch\":%d,\"context\":%d,\"budget\":%d,\"dense_layers\":%d,"
        "\"steps\":%d,\"ms_per_step\":%.4f,\"tok_per_s\":%.1f,\"pages_attended_frac\":%.4f,"
        "\"device_pages\":%d,\"tier_hit_rate\":%.4f,\"bytes_moved_per_step\":%.0f,"
        "\"bytes_direct_per_step\":%.0f}",
        o.shape.c_str(), o.fill.c_str(), mode.c_str(), batch, context, quest ? o.budget : 0,
        quest ? o.dense_layers : c.n_layers, o.steps, 1000 * seconds / o.steps,
        batch * o.steps / seconds,
        double(sum.pages_attended) / double(std::max<int64_t>(1, sum.pages_total)), c.device_pages,
        hit, double(sum.bytes_moved) / o.steps, double(sum.bytes_direct) / o.steps);
    return true;
  }
};

std::vector<std::string> Words(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string w; std::getline(ss, w, ',');)
    if (!w.empty()) out.push_back(w);
  return out;
}

}  // namespace
}  // namespace tinyserve::cuda::bench

int main(int argc, char** argv) {
  using namespace tinyserve::cuda;
  using namespace tinyserve::cuda::bench;
  if (!HaveDevice()) return 2;
  JsonLines out(Arg(argc, argv, "--out"));
  Options o;
  if (const std::string s = Arg(argc, argv, "--shape"); !s.empty()) o.shape = s;
  if (const std::string s = Arg(argc, argv, "--fill"); !s.empty()) o.fill = s;
  if (const std::string s = Arg(argc, argv, "--steps"); !s.empty()) o.steps = std::atoi(s.c_str());
  o.smoke = Flag(argc, argv, "--smoke");
  if (o.steps < 1) {
    std::fprintf(stderr, "--steps must be >= 1\n");
    return 1;
  }
  if (o.shape != "smollm2" && o.shape != "tinyllama") {
    std::fprintf(stderr, "--shape must be smollm2 or tinyllama\n");
    return 1;
  }
  if (o.fill != "prefill" && o.fill != "random") {
    std::fprintf(stderr, "--fill must be prefill or random\n");
    return 1;
  }
  const std::string b = Arg(argc, argv, "--budget");
  o.budget = o.smoke                  ? 64
             : !b.empty()             ? std::atoi(b.c_str())
             : o.shape == "tinyllama" ? 2048
                                      : 1024;
  o.dense_layers = o.smoke ? 1 : 2;
  o.contexts = IntList(Arg(argc, argv, "--contexts"), {8000});
  o.batches = IntList(Arg(argc, argv, "--batches"), {1, 8});
  const std::string m = Arg(argc, argv, "--modes");
  o.modes = Words(m.empty() ? "dense,quest,quest-tiered" : m);
  for (const std::string& mode : o.modes)
    if (mode != "dense" && mode != "quest" && mode != "quest-tiered") {
      std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
      return 1;
    }
  const int max_context = *std::max_element(o.contexts.begin(), o.contexts.end());
  const Deadline deadline(argc, argv);
  bool ok = true;
  for (int batch : o.batches) {
    // Dense and quest on one model, then the tiered mode on its own.
    for (const bool tiered : {false, true}) {
      std::vector<std::string> modes;
      for (const std::string& mode : o.modes)
        if ((mode == "quest-tiered") == tiered) modes.push_back(mode);
      if (modes.empty()) continue;
      if (deadline.Passed()) {
        std::fprintf(stderr, "time limit reached; stopping\n");
        return ok ? 0 : 1;
      }
      Bench bench(o);
      if (!bench.Init(max_context, batch, tiered)) {
        ok = false;
        continue;
      }
      for (int context : o.contexts) {
        if (deadline.Passed()) break;
        if (!bench.Fill(context)) {
          ok = false;
          break;
        }
        for (const std::string& mode : modes) ok = bench.Decode(out, context, mode) && ok;
      }
    }
  }
  return ok ? 0 : 1;
}
