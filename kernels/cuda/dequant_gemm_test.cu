// GPU vs CPU tests of ggml block dequantization, the dequantizing GEMV and the cuBLAS linear.
#include <random>
#include <sstream>

#include "kernels/cuda/dequant.cuh"
#if defined(TS_HAVE_CUBLAS)
#include "kernels/cuda/gemm.cuh"
#endif
#include "kernels/cuda/reference/ops_ref.h"
#include "kernels/cuda/test_util.cuh"

namespace tinyserve::cuda {
namespace {

using testing::AllClose;
using testing::DeviceBuffer;

class DequantGemmTest : public testing::CudaTest {};

// Random blocks of a type: random quant bytes, small finite f16 scale (and min).
std::vector<uint8_t> RandomBlocks(std::mt19937& rng, QuantType t, int64_t nblocks) {
  const int bytes = QuantBlockBytes(t);
  std::vector<uint8_t> b(nblocks * bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> sc(-0.05f, 0.05f);
  for (auto& x : b) x = static_cast<uint8_t>(byte(rng));
  for (int64_t i = 0; i < nblocks; ++i) {
    const uint16_t d = static_cast<__half_raw>(__float2half_rn(sc(rng))).x;
    std::memcpy(&b[i * bytes], &d, 2);
    if (t == QuantType::kQ4_1) {
      const uint16_t m = static_cast<__half_raw>(__float2half_rn(sc(rng))).x;
      std::memcpy(&b[i * bytes + 2], &m, 2);
    }
  }
  return b;
}

const char* QName(QuantType t) {
  return t == QuantType::kQ4_0 ? "Q4_0" : (t == QuantType::kQ4_1 ? "Q4_1" : "Q8_0");
}

TEST_F(DequantGemmTest, DequantizeMatchesReference) {
  std::mt19937 rng(11);
  for (QuantType q : {QuantType::kQ4_0, QuantType::kQ4_1, QuantType::kQ8_0})
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
      const int64_t nb = 1000;
      const auto blocks = RandomBlocks(rng, q, nb);
      std::vector<float> want(nb * 32);
      ref::DequantBlocks(static_cast<int>(q), blocks.data(), nb, want.data());
      for (auto& w : want) w = testing::RoundTo(t, w);
      DeviceBuffer bd, od(nb * 32 * DTypeBytes(t));
      testing::UploadInts(bd, blocks);
      od.Poison();
      ASSERT_EQ(DequantizeBlocks(q, bd.get(), t, od.get(), nb * 32, nullptr), cudaSuccess);
      EXPECT_TRUE(AllClose(std::string("dequant ") + QName(q) + " " + DTypeName(t),
                           testing::Download(od.get(), t, want.size()), want, 1e-6f, 1e-6f));
    }
}

TEST_F(DequantGemmTest, QuantGemvMatchesReference) {
  std::mt19937 rng(12);
  for (QuantType q : {QuantType::kQ4_0, QuantType::kQ4_1, QuantType::kQ8_0})
    for (DType t : {DType::kF32, DType::kF16})
      for (int M : {1, 3, 8}) {
        const int N = 300, K = 2048;
        const auto blocks = RandomBlocks(rng, q, int64_t{N} * K / 32);
        std::vector<float> w(size_t(N) * K), want(size_t(M) * N);
        ref::DequantBlocks(static_cast<int>(q), blocks.data(), int64_t{N} * K / 32, w.data());
        const auto x = testing::RandomRounded(rng, t, size_t(M) * K, -1, 1);
        ref::Linear(x.data(), w.data(), want.data(), M, N, K);
        DeviceBuffer bd, xd, yd(size_t(M) * N * DTypeBytes(t));
        testing::UploadInts(bd, blocks);
        testing::Upload(xd, t, x);
        yd.Poison();
        ASSERT_EQ(QuantGemv(q, bd.get(), t, xd.get(), yd.get(), M, N, K, nullptr), cudaSuccess);
        std::ostringstream cfg;
        cfg << "gemv " << QName(q) << " " << DTypeName(t) << " M=" << M;
        // Sums of 2048 products of magnitude ~0.4: absolute tolerance scaled to that.
        EXPECT_TRUE(AllClose(cfg.str(), testing::Download(yd.get(), t, want.size()), want,
                             testing::Tol(t), 20 * testing::Tol(t)));
      }
}

#if defined(TS_HAVE_CUBLAS)
TEST_F(DequantGemmTest, CublasLinearMatchesReference) {
  std::mt19937 rng(13);
  CublasGemm gemm;
  ASSERT_TRUE(gemm.Init()) << LastLaunchError();
  for (DType t : {DType::kF16, DType::kBF16})
    for (int M : {1, 16, 33}) {
      const int N = 320, K = 576;
      const auto x = testing::RandomRounded(rng, t, size_t(M) * K, -1, 1);
      const auto w = testing::RandomRounded(rng, t, size_t(N) * K, -0.1f, 0.1f);
      std::vector<float> want(size_t(M) * N);
      ref::Linear(x.data(), w.data(), want.data(), M, N, K);
      DeviceBuffer xd, wd, yd(size_t(M) * N * 2);
      testing::Upload(xd, t, x);
      testing::Upload(wd, t, w);
      yd.Poison();
      ASSERT_EQ(gemm.Linear(t, xd.get(), wd.get(), yd.get(), M, N, K, nullptr), cudaSuccess)
          << LastLaunchError();
      TS_CUDA_CHECK(cudaDeviceSynchronize());
      std::ostringstream cfg;
      cfg << "linear " << DTypeName(t) << " M=" << M;
      EXPECT_TRUE(AllClose(cfg.str(), testing::Download(yd.get(), t, want.size()), want,
                           testing::Tol(t), testing::Tol(t)));
      // The f32-output variant (logits): no output rounding, so an fp32 tolerance.
      DeviceBuffer yf(size_t(M) * N * 4);
      yf.Poison();
      ASSERT_EQ(gemm.LinearF32Out(t, xd.get(), wd.get(), yf.get<float>(), M, N, K, nullptr),
                cudaSuccess)
          << LastLaunchError();
      TS_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_TRUE(AllClose(cfg.str() + " f32 out", testing::Download(yf.get(), DType::kF32, want.size()),
                           want, 1e-4f, 1e-4f));
    }
}
#endif  // TS_HAVE_CUBLAS

}  // namespace
}  // namespace tinyserve::cuda
