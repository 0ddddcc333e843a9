// Benchmark of CPU decode attention (AttendSpans) on SmolLM2-135M shapes: one decode token's
// attention over a paged fp16 KV cache, per (layer, KV head), as the runner calls it (one span
// per 16-token page). The cache holds `layers` layers x 3 KV heads of `context` tokens, laid out
// like PagedKvCache ([page][head][token][d] per layer), so at 8K the K/V bytes (188 MB) come from
// DRAM as in a real decode step (with 30 layers). Reports the time per decode step's attention
// (all layers and heads, one thread) and the GB/s of K/V read.
//
//   build/bin/attention_cpu_bench
//   build/bin/attention_cpu_bench --benchmark_filter='context:8192'
// BM_PrefillBlock times one block of prefill rows (AttendCausalBlock) the same way.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "common/fp16.h"
#include "kernels/cpu/attention.h"

namespace tinyserve {
namespace {

constexpr int kKvHeads = 3, kGroup = 3, kD = 64, kPage = 16;

void BM_DecodeAttention(benchmark::State& state) {
  const int context = static_cast<int>(state.range(0));
  const bool shuffled = state.range(1) != 0;
  const int layers = static_cast<int>(state.range(2));
  const int pages = context / kPage;
  const size_t page_elems = size_t{kKvHeads} * kPage * kD;
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<std::vector<fp16_t>> k(layers), v(layers);
  for (int l = 0; l < layers; ++l) {
    k[l].resize(page_elems * pages);
    v[l].resize(page_elems * pages);
    for (auto& x : k[l]) x = FloatToFp16(dist(rng));
    for (auto& x : v[l]) x = FloatToFp16(dist(rng));
  }
  // Pages of the sequence in order (a fresh pool) or shuffled (a long-running pool's free list).
  std::vector<int> order(pages);
  std::iota(order.begin(), order.end(), 0);
  if (shuffled) std::shuffle(order.begin(), order.end(), rng);
  std::vector<float> q(kGroup * kD), out(kGroup * kD);
  for (float& x : q) x = dist(rng);
  std::vector<KvSpan> spans(pages);
  AttendOptions opt;
  opt.scale = 1.0f / std::sqrt(static_cast<float>(kD));
  for (auto _ : state) {
    for (int l = 0; l < layers; ++l)
      for (int h = 0; h < kKvHeads; ++h) {
        for (int p = 0; p < pages; ++p) {
          const size_t off = size_t(order[p]) * page_elems + size_t(h) * kPage * kD;
          spans[p].k = k[l].data() + off;
          spans[p].v = v[l].data() + off;
          spans[p].n = kPage;
        }
        AttendSpans(q.data(), kGroup, kD, spans.data(), pages, opt, out.data());
        benchmark::DoNotOptimize(out.data());
      }
  }
  const double bytes = 2.0 * layers * kKvHeads * double(context) * kD * sizeof(fp16_t);
  state.counters["GB/s"] =
      benchmark::Counter(bytes * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["ns/token/head"] =
      benchmark::Counter(double(state.iterations()) * layers * kKvHeads * context,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
// layers = 1 at context 1024 keeps the cache in L2: the compute alone.
BENCHMARK(BM_DecodeAttention)
    ->ArgNames({"context", "shuffled", "layers"})
    ->Args({1024, 0, 1})
    ->Args({1024, 0, 30})
    ->Args({8192, 0, 30})
    ->Args({8192, 1, 30})
    ->Unit(benchmark::kMillisecond);

// One prefill block (AttendCausalBlock, as the runner calls it): `rows` rows of one sequence and
// one KV head, the last of a `context`-token prompt, over its fp16 pages. Reports the time per
// block and the GFLOP/s of Q·Kᵀ and P·V (4·d flops per query vector and token it sees).
// TINYSERVE_ATTENTION_ISA=avx512 runs the AVX-512 kernel where the AMX one would run.
void BM_PrefillBlock(benchmark::State& state) {
  const int context = static_cast<int>(state.range(0));
  const int kRows = static_cast<int>(state.range(1));
  const int pages = context / kPage;
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<fp16_t> k(size_t{kPage} * kD * pages), v(k.size());
  for (auto& x : k) x = FloatToFp16(dist(rng));
  for (auto& x : v) x = FloatToFp16(dist(rng));
  std::vector<KvSpan> spans(pages);
  for (int p = 0; p < pages; ++p)
    spans[p] = {k.data() + size_t(p) * kPage * kD, v.data() + size_t(p) * kPage * kD, kPage};
  const int64_t stride = kGroup * kD;
  std::vector<float> q(kRows * stride), out(kRows * stride);
  for (float& x : q) x = dist(rng);
  const int64_t pos0 = context - kRows;
  for (auto _ : state) {
    AttendCausalBlock(q.data(), stride, kRows, kGroup, kD, pos0, spans.data(), pages,
                      1.0f / std::sqrt(static_cast<float>(kD)), out.data(), stride);
    benchmark::DoNotOptimize(out.data());
  }
  const double seen = kRows * (pos0 + (kRows + 1) / 2.0);  // (row, token) pairs
  state.counters["GFLOP/s"] = benchmark::Counter(
      4.0 * kD * kGroup * seen * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_PrefillBlock)
    ->ArgNames({"context", "rows"})
    ->ArgsProduct({{512, 4096, 8192}, {32, 64}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace tinyserve

BENCHMARK_MAIN();
