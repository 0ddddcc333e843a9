// File: kernels/cuda/bench/bench_util.cuh
// Helpers of the GPU benchmarks: random device fill (random_fill.cuh), event timing with the
// median of N, JSON-lines output, and a little argument parsing.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/launch_status.cuh"
#include "kernels/cuda/random_fill.cuh"

namespace tinyserve::cuda::bench {

template <typename T>
inline void FillUniform(T* out, int64_t n, uint64_t seed, float scale, cudaStream_t s = nullptr) {
  TS_CUDA_CHECK(LaunchFillUniform(out, n, seed, scale, s));
}

// Median of `reps` timings (ms) of fn on `stream`, after `warmup` untimed calls. fn(i) gets the
// iteration index (to rotate buffers).
inline double MedianMs(cudaStream_t stream, int warmup, int reps, const std::function<void(int)>& fn) {
  for (int i = 0; i < warmup; ++i) fn(i);
  std::vector<cudaEvent_t> ev(2 * reps);
  for (auto& e : ev) TS_CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    TS_CUDA_CHECK(cudaEventRecord(ev[2 * i], stream));
    fn(warmup + i);
    TS_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], stream));
  }
  TS_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i) TS_CUDA_CHECK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
  for (auto& e : ev) TS_CUDA_CHECK(cudaEventDestroy(e));
  std::sort(ms.begin(), ms.end());
  return ms[reps / 2];
}

// Appends JSON lines to a file (and echoes them to stdout).
class JsonLines {
 public:
  explicit JsonLines(const std::string& path) {
    if (!path.empty()) f_ = std::fopen(path.c_str(), "a");
  }
  ~JsonLines() {
    if (f_) std::fclose(f_);
  }
  void Write(const char* fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    std::printf("%s\n", buf);
    std::fflush(stdout);
    if (f_) {
      std::fprintf(f_, "%s\n", buf);
      std::fflush(f_);
    }
  }

 private:
  std::FILE* f_ = nullptr;
};

// "1,8,16" -> {1, 8, 16}; empty -> dflt.
inline std::vector<int> IntList(const std::string& s, std::vector<int> dflt) {
  if (s.empty()) return dflt;
  std::vector<int> v;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = std::min(s.find(',', start), s.size());
    v.push_back(std::atoi(s.substr(start, comma - start).c_str()));
    start = comma + 1;
  }
  return v;
}

// --name value lookup; "" if absent.
inline std::string Arg(int argc, char** argv, const char* name) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return "";
}
inline bool Flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}

// --max-seconds S of a benchmark: Passed() once S seconds have gone since construction (never
// without the flag).
class Deadline {
 public:
  Deadline(int argc, char** argv)
      : limit_(std::atof(Arg(argc, argv, "--max-seconds").c_str())),
        t0_(std::chrono::steady_clock::now()) {}
  bool Passed() const {
    return limit_ > 0 &&
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count() > limit_;
  }

 private:
  double limit_;
  std::chrono::steady_clock::time_point t0_;
};

// False (and says so on stderr) without a CUDA device: the benchmarks then exit 2.
inline bool HaveDevice() {
  if (CudaDeviceCount() > 0) return true;
  std::fprintf(stderr, "no CUDA device\n");
  return false;
}

}  // namespace tinyserve::cuda::bench
