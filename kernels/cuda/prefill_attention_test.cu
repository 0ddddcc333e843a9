// GPU vs CPU test of causal prefill attention over the paged cache.
#include <algorithm>
#include <numeric>
#include <random>
#include <sstream>

#include "kernels/cuda/prefill_attention.cuh"
#include "kernels/cuda/reference/attention_ref.h"
#include "kernels/cuda/test_util.cuh"

namespace tinyserve::cuda {
namespace {

using testing::DeviceBuffer;

class PrefillAttentionTest : public testing::CudaTest {};

TEST_F(PrefillAttentionTest, MatchesReference) {
  std::mt19937 rng(5);
  const int gqa[3][2] = {{4, 4}, {9, 3}, {8, 1}};
  for (DType t : {DType::kF16, DType::kBF16})
    for (int d : {64, 128})
      for (const auto& h : gqa)
        for (int P : {8, 16, 32}) {
          const int hq = h[0], hkv = h[1];
          const std::vector<int> lens = {1, 2 * P + 3, 77};
          const std::vector<int> nq = {1, 2 * P + 3, 19};  // prefill from 0, and a later chunk
          std::ostringstream cfg;
          cfg << DTypeName(t) << " d=" << d << " Hq=" << hq << " Hkv=" << hkv << " P=" << P;
          const int B = 3;
          int pool = 0;
          for (int L : lens) pool += (L + P - 1) / P;
          std::vector<int32_t> perm(pool);
          std::iota(perm.begin(), perm.end(), 0);
          std::shuffle(perm.begin(), perm.end(), rng);
          ref::HostPagedKv kv;
          kv.Resize(pool, hkv, P, d);
          std::fill(kv.k.begin(), kv.k.end(), NAN);
          std::fill(kv.v.begin(), kv.v.end(), NAN);
          std::vector<std::vector<int32_t>> tables;
          std::vector<int32_t> ip{0}, ix, qip{0};
          for (int b = 0, next = 0; b < B; ++b) {
            const int n = (lens[b] + P - 1) / P;
            tables.emplace_back(perm.begin() + next, perm.begin() + next + n);
            next += n;
            ix.insert(ix.end(), tables[b].begin(), tables[b].end());
            ip.push_back(static_cast<int32_t>(ix.size()));
            qip.push_back(qip.back() + nq[b]);
            const auto kn = testing::RandomRounded(rng, t, size_t(lens[b]) * hkv * d, -1, 1);
            const auto vn = testing::RandomRounded(rng, t, size_t(lens[b]) * hkv * d, -1, 1);
            ref::AppendKv(kv, tables[b], 0, kn.data(), vn.data(), lens[b]);
          }
          const auto q = testing::RandomRounded(rng, t, size_t(qip.back()) * hq * d, -2, 2);
          std::vector<float> want(q.size());
          for (int b = 0; b < B; ++b)
            ref::PrefillAttention(kv, tables[b], lens[b], nq[b], q.data() + size_t(qip[b]) * hq * d,
                                  hq, 1.0 / std::sqrt(double(d)),
                                  want.data() + size_t(qip[b]) * hq * d);
          DeviceBuffer kc, vc, ipd, ixd, qipd, lensd, qd, out(q.size() * DTypeBytes(t));
          testing::Upload(kc, t, kv.k);
          testing::Upload(vc, t, kv.v);
          testing::Upload(qd, t, q);
          testing::UploadInts(ipd, ip);
          testing::UploadInts(ixd, ix);
          testing::UploadInts(qipd, qip);
          testing::UploadInts(lensd, lens);
          out.Poison();
          PrefillAttentionParams p;
          p.dtype = t;
          p.layout = PagedKvLayout{pool, hkv, P, d};
          p.batch = B;
          p.num_q_heads = hq;
          p.q = qd.get();
          p.q_stride = int64_t{hq} * d;
          p.out = out.get();
          p.out_stride = p.q_stride;
          p.q_indptr = qipd.get<int32_t>();
          p.seq_lens = lensd.get<int32_t>();
          p.page_indptr = ipd.get<int32_t>();
          p.page_indices = ixd.get<int32_t>();
          p.k_cache = kc.get();
          p.v_cache = vc.get();
          p.max_q_per_seq = *std::max_element(nq.begin(), nq.end());
          ASSERT_EQ(PrefillAttention(p, nullptr), cudaSuccess) << LastLaunchError();
          TS_CUDA_CHECK(cudaDeviceSynchronize());
          EXPECT_TRUE(testing::AllClose(cfg.str(), testing::Download(out.get(), t, q.size()), want,
                                        testing::Tol(t), testing::Tol(t)));
        }
}

}  // namespace
}  // namespace tinyserve::cuda
