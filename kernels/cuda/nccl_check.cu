// One-rank NCCL sanity check: ncclCommInitRank with world size 1, an all-reduce (sum) of a float
// buffer in place, and a check that it is unchanged (the sum over one rank). Exit code 0 on
// success. Built only when NCCL is found.
#include <cstdio>
#include <vector>

#include <nccl.h>

#include "kernels/cuda/cuda_check.cuh"

#define NCCL_CHECK(stmt)                                                                     \
  do {                                                                                       \
    ncclResult_t r_ = (stmt);                                                                \
    if (r_ != ncclSuccess) {                                                                 \
      std::fprintf(stderr, "NCCL error %s at %s:%d: %s\n", ncclGetErrorString(r_), __FILE__, \
                   __LINE__, #stmt);                                                         \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)

int main() {
  if (tinyserve::cuda::CudaDeviceCount() == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 2;
  }
  int version = 0;
  NCCL_CHECK(ncclGetVersion(&version));
  ncclUniqueId id;
  NCCL_CHECK(ncclGetUniqueId(&id));
  ncclComm_t comm;
  TS_CUDA_CHECK(cudaSetDevice(0));
  NCCL_CHECK(ncclCommInitRank(&comm, 1, id, 0));
  const size_t n = size_t(1) << 20;
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 977) * 0.5f;
  float* buf;
  TS_CUDA_CHECK(cudaMalloc(&buf, n * sizeof(float)));
  TS_CUDA_CHECK(cudaMemcpy(buf, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  cudaStream_t s;
  TS_CUDA_CHECK(cudaStreamCreate(&s));
  NCCL_CHECK(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, comm, s));
  TS_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<float> back(n);
  TS_CUDA_CHECK(cudaMemcpy(back.data(), buf, n * sizeof(float), cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += back[i] != host[i];
  NCCL_CHECK(ncclCommDestroy(comm));
  TS_CUDA_CHECK(cudaFree(buf));
  TS_CUDA_CHECK(cudaStreamDestroy(s));
  std::printf("{\"kind\":\"nccl\",\"version\":%d,\"elements\":%zu,\"mismatches\":%zu,\"ok\":%s}\n",
              version, n, bad, bad == 0 ? "true" : "false");
  return bad == 0 ? 0 : 1;
}
