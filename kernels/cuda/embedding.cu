#include "kernels/cuda/embedding.cuh"

namespace tinyserve::cuda {
namespace {

// One CTA per row, 16-byte vectors (dtype-agnostic copy).
__global__ void EmbeddingKernel(const uint4* table, const int32_t* ids, uint4* out, int vocab,
                                int vecs) {
  const int r = blockIdx.x;
  const int id = ids[r];
  const bool ok = id >= 0 && id < vocab;
  for (int i = threadIdx.x; i < vecs; i += blockDim.x)
    out[int64_t{r} * vecs + i] = ok ? table[int64_t{id} * vecs + i] : make_uint4(0, 0, 0, 0);
}

}  // namespace

cudaError_t EmbeddingLookup(DType dtype, const void* table, const int32_t* ids, void* out,
                            int rows, int vocab, int dim, cudaStream_t stream) {
  TS_REQUIRE(table && ids && out, "EmbeddingLookup: null pointer");
  TS_REQUIRE(rows > 0 && vocab > 0 && dim > 0, "EmbeddingLookup: sizes must be > 0");
  const int64_t row_bytes = int64_t{dim} * static_cast<int64_t>(DTypeBytes(dtype));
  TS_REQUIRE(row_bytes % 16 == 0, "EmbeddingLookup: a row must be a multiple of 16 bytes");
  TS_REQUIRE((reinterpret_cast<uintptr_t>(table) & 15) == 0 &&
                 (reinterpret_cast<uintptr_t>(out) & 15) == 0,
             "EmbeddingLookup: pointers must be 16-byte aligned");
  LaunchKernel(EmbeddingKernel, rows, 128, 0, stream, static_cast<const uint4*>(table), ids,
               static_cast<uint4*>(out), vocab, static_cast<int>(row_bytes / 16));
  TS_RETURN_LAUNCH_ERROR();
  return cudaSuccess;
}

}  // namespace tinyserve::cuda
