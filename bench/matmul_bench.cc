// Benchmarks of MatMul on SmolLM2-135M shapes, per weight type, instruction set, layout and
// thread count. Reports GB/s of weight bytes streamed (bytes = rows × row_bytes per call).
//
// Each per-shape benchmark rotates over enough copies of the matrix (>= 128 MiB) that the
// weights come from DRAM, as in decode, where 96 MB of weights stream past once per token.
// DecodeToken runs the matrix products of one whole SmolLM2 token: 30 layers × (q, k, v, o,
// gate, up, down) in Q4_1 plus the 49152 × 576 Q8_0 LM head.
//
//   build/bin/matmul_bench --benchmark_filter='DecodeToken'
//   build/bin/matmul_bench --benchmark_filter='MatVec/Q4_1/576x576'
#include <benchmark/benchmark.h>

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/fp16.h"
#include "common/thread_pool.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/matmul.h"

namespace tinyserve {
namespace {

std::vector<float> RandomFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& f : v) f = dist(rng);
  return v;
}

Matrix MakeMatrix(GgmlType type, int64_t rows, int64_t cols, bool split, uint32_t seed) {
  const std::vector<float> f = RandomFloats(rows * cols, seed);
  if (type == GgmlType::kF32) return MatrixFromFloats(f.data(), rows, cols);
  const size_t row_bytes = GgmlRowBytes(type, cols);
  auto bytes = std::make_shared<std::vector<uint8_t>>(row_bytes * rows);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* dst = bytes->data() + r * row_bytes;
    const float* src = f.data() + r * cols;
    switch (type) {
      case GgmlType::kF16:
        for (int64_t c = 0; c < cols; ++c) {
          const uint16_t h = FloatToFp16(src[c]);
          std::memcpy(dst + 2 * c, &h, 2);
        }
        break;
      case GgmlType::kQ4_0: QuantizeRowQ4_0(src, dst, cols); break;
      case GgmlType::kQ4_1: QuantizeRowQ4_1(src, dst, cols); break;
      case GgmlType::kQ8_0:
        QuantizeRowQ8_0(src, dst, cols);
        break;
      default: {  // Q5_0, Q5_1, IQ4_NL: random codes (no reference quantizer), scale 1/16
        const int bb = GetGgmlTypeInfo(type)->block_bytes;
        for (int64_t b = 0; b < cols / 32; ++b) {
          for (int j = 0; j < bb; ++j)
            dst[bb * b + j] = static_cast<uint8_t>((src[32 * b + j % 32] + 1) * 127.5f);
          const uint16_t d = FloatToFp16(1.0f / 16), m = FloatToFp16(-1.0f);
          std::memcpy(dst + bb * b, &d, 2);
          if (type == GgmlType::kQ5_1) std::memcpy(dst + bb * b + 2, &m, 2);
        }
        break;
      }
    }
  }
  Matrix m = MatrixView(type, rows, cols, bytes->data());
  m.storage = bytes;
  return split ? RepackToSplit(m) : m;
}

ThreadPool* Pool(int threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  auto& p = pools[threads];
  if (!p) p = std::make_unique<ThreadPool>(threads);
  return p.get();
}

// Copies of one matrix, >= 128 MiB in all (at least one), kept for the whole run.
// hot: a single copy, so the weights stay in cache (the kernels' compute speed).
const std::vector<Matrix>& Copies(GgmlType type, int64_t rows, int64_t cols, bool split,
                                  bool hot) {
  static std::map<std::string, std::vector<Matrix>> cache;
  const std::string key = std::string(GgmlTypeName(type)) + std::to_string(rows) + "x" +
                          std::to_string(cols) + (split ? "s" : "g") + (hot ? "h" : "c");
  auto& v = cache[key];
  if (v.empty()) {
    const size_t bytes = GgmlRowBytes(type, cols) * rows;
    const size_t n = hot ? 1 : std::max<size_t>(2, (128u << 20) / bytes + 1);
    v.push_back(MakeMatrix(type, rows, cols, split, 1));
    for (size_t i = 1; i < n; ++i) v.push_back(SliceRows(v[0], 0, rows));  // owned copies
  }
  return v;
}

void BM_MatMul(benchmark::State& state, GgmlType type, int64_t rows, int64_t cols,
               int64_t n_tokens, CpuIsa isa, int threads, bool split, bool hot) {
  if (SetActiveCpuIsa(isa) != isa) {
    state.SkipWithError("ISA not available");
    return;
  }
  const auto& copies = Copies(type, rows, cols, split, hot);
  const std::vector<float> x = RandomFloats(n_tokens * cols, 2);
  std::vector<float> y(n_tokens * rows);
  ThreadPool* pool = Pool(threads);
  size_t i = 0;
  for (auto _ : state) {
    MatMul(copies[i], x.data(), n_tokens, y.data(), pool);
    if (++i == copies.size()) i = 0;
    benchmark::DoNotOptimize(y.data());
  }
  const double bytes = static_cast<double>(copies[0].row_bytes) * rows;
  state.counters["GB/s"] = benchmark::Counter(bytes * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(n_tokens) * state.iterations(), benchmark::Counter::kIsRate);
}

// All matrix products of one SmolLM2-135M token (or n_tokens tokens): 210 Q4_1 + Q8_0 head.
void BM_DecodeToken(benchmark::State& state, GgmlType layer_type, int64_t n_tokens, CpuIsa isa,
                    int threads, bool split) {
  if (SetActiveCpuIsa(isa) != isa) {
    state.SkipWithError("ISA not available");
    return;
  }
  struct Model {
    std::vector<Matrix> layers;
    Matrix head;
  };
  static std::map<std::string, Model> models;
  Model& m = models[std::string(GgmlTypeName(layer_type)) + (split ? "s" : "g")];
  if (m.layers.empty()) {
    const int64_t shapes[7][2] = {{576, 576}, {192, 576}, {192, 576}, {576, 576},
                                  {1536, 576}, {1536, 576}, {576, 1536}};
    uint32_t seed = 10;
    for (int l = 0; l < 30; ++l)
      for (auto& s : shapes) m.layers.push_back(MakeMatrix(layer_type, s[0], s[1], split, ++seed));
    m.head = MakeMatrix(GgmlType::kQ8_0, 49152, 576, split, 3);
  }
  const std::vector<float> x = RandomFloats(n_tokens * 1536, 4);
  std::vector<float> y(n_tokens * 49152);
  ThreadPool* pool = Pool(threads);
  double bytes = static_cast<double>(m.head.row_bytes) * m.head.rows;
  for (const Matrix& w : m.layers) bytes += static_cast<double>(w.row_bytes) * w.rows;
  for (auto _ : state) {
    for (const Matrix& w : m.layers) MatMul(w, x.data(), n_tokens, y.data(), pool);
    MatMul(m.head, x.data(), n_tokens, y.data(), pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GB/s"] = benchmark::Counter(bytes * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(n_tokens) * state.iterations(), benchmark::Counter::kIsRate);
}

void RegisterAll() {
  const CpuIsa isas[] = {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAmx};
  struct Shape {
    GgmlType type;
    int64_t rows, cols;
  };
  const Shape shapes[] = {
      {GgmlType::kQ4_1, 576, 576},  {GgmlType::kQ4_1, 192, 576},   {GgmlType::kQ4_1, 1536, 576},
      {GgmlType::kQ4_1, 576, 1536}, {GgmlType::kQ8_0, 49152, 576}, {GgmlType::kQ4_0, 1536, 576},
      {GgmlType::kQ8_0, 1536, 576}, {GgmlType::kF16, 1536, 576},   {GgmlType::kF32, 1536, 576},
      {GgmlType::kQ5_0, 1536, 576}, {GgmlType::kQ5_1, 1536, 576},  {GgmlType::kIQ4_NL, 1536, 576},
  };
  for (const Shape& s : shapes) {
    for (int64_t n : {1, 8, 16, 32, 64, 512}) {
      for (CpuIsa isa : isas) {
        if (isa == CpuIsa::kScalar && (n > 8 || s.rows > 1536)) continue;  // too slow to matter
        if (n == 512 && s.rows > 1536) continue;
        for (int threads : {1, 2}) {
          for (bool split : {true, false}) {
            if (!split && (s.type == GgmlType::kF16 || s.type == GgmlType::kF32)) continue;
            if (!split && n > 1) continue;
            const std::string name = std::string("MatVec/") + std::string(GgmlTypeName(s.type)) +
                                     "/" + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
                                     "/tok:" + std::to_string(n) + "/" +
                                     std::string(CpuIsaName(isa)) + "/threads:" +
                                     std::to_string(threads) + (split ? "/split" : "/ggml");
            benchmark::RegisterBenchmark(name.c_str(), BM_MatMul, s.type, s.rows, s.cols, n, isa,
                                         threads, split, /*hot=*/false)
                ->MinTime(0.2)
                ->UseRealTime()
                ->Unit(benchmark::kMicrosecond);
            if (n == 1 && threads == 1 && s.rows <= 1536) {
              benchmark::RegisterBenchmark((name + "/hot").c_str(), BM_MatMul, s.type, s.rows,
                                           s.cols, n, isa, threads, split, /*hot=*/true)
                  ->MinTime(0.2)
                  ->UseRealTime()
                  ->Unit(benchmark::kMicrosecond);
            }
          }
        }
      }
    }
  }
  for (GgmlType t : {GgmlType::kQ4_1, GgmlType::kQ4_0}) {
    for (int64_t n : {1, 8, 64}) {
      for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAmx}) {
        for (int threads : {1, 2}) {
          for (bool split : {true, false}) {
            if (!split && (n > 1 || t != GgmlType::kQ4_1)) continue;
            const std::string name = std::string("DecodeToken/") + std::string(GgmlTypeName(t)) +
                                     "/tok:" + std::to_string(n) + "/" +
                                     std::string(CpuIsaName(isa)) + "/threads:" +
                                     std::to_string(threads) + (split ? "/split" : "/ggml");
            benchmark::RegisterBenchmark(name.c_str(), BM_DecodeToken, t, n, isa, threads, split)
                ->MinTime(1.0)
                ->UseRealTime()
                ->Unit(benchmark::kMillisecond);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace tinyserve

int main(int argc, char** argv) {
  tinyserve::RegisterAll();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
