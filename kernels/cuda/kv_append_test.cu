// GPU vs CPU test of the paged KV append and box update: a prefill chunk (partial first and last
// pages), then several decode steps, over shuffled page tables; stale slots start as NaN.
#include <algorithm>
#include <numeric>
#include <random>
#include <sstream>

#include "kernels/cuda/kv_append.cuh"
#include "kernels/cuda/reference/attention_ref.h"
#include "kernels/cuda/test_util.cuh"

// GCC 12 at -O3 reports a false -Wfree-nonheap-object on a std::vector<float> freed at the end of
// the long test body below (an inlining artefact of libstdc++, not a real free of a non-heap
// pointer).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wfree-nonheap-object"
#endif

namespace tinyserve::cuda {
namespace {

using testing::DeviceBuffer;

class KvAppendTest : public testing::CudaTest {};

// The layout formula of paged_kv.cuh, pinned down independently of the kernels.
TEST(PagedKvLayoutTest, OffsetsMatchTheDocumentedLayout) {
  const PagedKvLayout l{10, 3, 16, 64};
  EXPECT_TRUE(l.Valid());
  EXPECT_EQ(l.KvOffset(0, 0, 0), 0);
  EXPECT_EQ(l.KvOffset(0, 0, 1), 64);
  EXPECT_EQ(l.KvOffset(0, 1, 0), 16 * 64);
  EXPECT_EQ(l.KvOffset(2, 1, 5), ((2 * 3 + 1) * 16 + 5) * 64);
  EXPECT_EQ(l.MetaOffset(2, 1), (2 * 3 + 1) * 64);
  EXPECT_EQ(l.KvElements(), 10 * 3 * 16 * 64);
  EXPECT_EQ(l.PagesFor(16), 1);
  EXPECT_EQ(l.PagesFor(17), 2);
  EXPECT_FALSE((PagedKvLayout{10, 3, 12, 64}.Valid()));  // page size not a power of two
}

TEST_F(KvAppendTest, PrefillThenDecodeMatchesReference) {
  std::mt19937 rng(7);
  for (DType t : {DType::kF16, DType::kBF16})
    for (int d : {64, 128})
      for (int P : {8, 16, 32}) {
        const int hkv = 2, B = 3;
        const std::vector<int> start = {0, 5, 2 * P + 3};     // tokens already cached
        const std::vector<int> chunk = {1, 3 * P + 2, P - 3};  // prefill chunk per sequence
        const int decode_steps = 3;
        std::ostringstream cfg;
        cfg << DTypeName(t) << " d=" << d << " P=" << P;
        // Page tables big enough for start + chunk + decode, shuffled over a pool.
        std::vector<std::vector<int32_t>> tables(B);
        int pool = 0;
        for (int b = 0; b < B; ++b) pool += (start[b] + chunk[b] + decode_steps + P - 1) / P;
        std::vector<int32_t> perm(pool);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        std::vector<int32_t> indptr{0}, indices;
        for (int b = 0, next = 0; b < B; ++b) {
          const int n = (start[b] + chunk[b] + decode_steps + P - 1) / P;
          tables[b].assign(perm.begin() + next, perm.begin() + next + n);
          next += n;
          indices.insert(indices.end(), tables[b].begin(), tables[b].end());
          indptr.push_back(static_cast<int32_t>(indices.size()));
        }
        ref::HostPagedKv kv;
        kv.Resize(pool, hkv, P, d);
        std::fill(kv.k.begin(), kv.k.end(), NAN);
        std::fill(kv.v.begin(), kv.v.end(), NAN);
        // Sequences' existing tokens (host only, then uploaded with the NaN stale slots).
        for (int b = 0; b < B; ++b) {
          const auto kn = testing::RandomRounded(rng, t, size_t(start[b]) * hkv * d, -1, 1);
          const auto vn = testing::RandomRounded(rng, t, size_t(start[b]) * hkv * d, -1, 1);
          ref::AppendKv(kv, tables[b], 0, kn.data(), vn.data(), start[b]);
        }
        DeviceBuffer kc, vc, mn, mx, ip, ix;
        testing::Upload(kc, t, kv.k);
        testing::Upload(vc, t, kv.v);
        testing::Upload(mn, t, kv.kmin);
        testing::Upload(mx, t, kv.kmax);
        testing::UploadInts(ip, indptr);
        testing::UploadInts(ix, indices);
        std::vector<int> len = start;
        for (int step = 0; step <= decode_steps; ++step) {
          const bool prefill = step == 0;
          std::vector<int32_t> new_ip{0}, lens_after(B);
          for (int b = 0; b < B; ++b)
            new_ip.push_back(new_ip.back() + (prefill ? chunk[b] : 1));
          const int rows = new_ip.back();
          const size_t row = size_t(hkv) * d;
          // Rows of k_new/v_new are 2*row apart: a strided view, as from a fused QKV buffer.
          auto kn = testing::RandomRounded(rng, t, rows * row, -1, 1);
          auto vn = testing::RandomRounded(rng, t, rows * row, -1, 1);
          std::vector<float> kvs(rows * 2 * row, NAN), vvs(rows * 2 * row, NAN);
          for (int r = 0; r < rows; ++r)
            for (size_t e = 0; e < row; ++e) {
              kvs[r * 2 * row + e] = kn[r * row + e];
              vvs[r * 2 * row + e] = vn[r * row + e];
            }
          for (int b = 0; b < B; ++b) {
            const int n = new_ip[b + 1] - new_ip[b];
            ref::AppendKv(kv, tables[b], len[b], kn.data() + new_ip[b] * row,
                          vn.data() + new_ip[b] * row, n);
            len[b] += n;
            lens_after[b] = len[b];
          }
          DeviceBuffer knd, vnd, nip, lensd;
          testing::Upload(knd, t, kvs);
          testing::Upload(vnd, t, vvs);
          testing::UploadInts(nip, new_ip);
          testing::UploadInts(lensd, lens_after);
          KvAppendParams p;
          p.dtype = t;
          p.layout = PagedKvLayout{pool, hkv, P, d};
          p.batch = B;
          p.k_new = knd.get();
          p.v_new = vnd.get();
          p.new_stride = int64_t(2 * row);
          p.new_indptr = nip.get<int32_t>();
          p.seq_lens = lensd.get<int32_t>();
          p.page_indptr = ip.get<int32_t>();
          p.page_indices = ix.get<int32_t>();
          p.max_new_per_seq = prefill ? *std::max_element(chunk.begin(), chunk.end()) : 1;
          p.k_cache = kc.get();
          p.v_cache = vc.get();
          p.kmin = mn.get();
          p.kmax = mx.get();
          ASSERT_EQ(AppendPagedKv(p, nullptr), cudaSuccess) << LastLaunchError();
          TS_CUDA_CHECK(cudaDeviceSynchronize());
          const std::string where = cfg.str() + " step " + std::to_string(step);
          // Exact equality on every valid slot and on the boxes of every used page.
          const auto gk = testing::Download(kc.get(), t, kv.k.size());
          const auto gv = testing::Download(vc.get(), t, kv.v.size());
          const auto gmn = testing::Download(mn.get(), t, kv.kmin.size());
          const auto gmx = testing::Download(mx.get(), t, kv.kmax.size());
          for (int b = 0; b < B; ++b)
            for (int tok = 0; tok < len[b]; ++tok)
              for (int h = 0; h < hkv; ++h)
                for (int e = 0; e < d; ++e) {
                  const size_t off = kv.Kv(tables[b][tok / P], h, tok % P) + e;
                  ASSERT_EQ(gk[off], kv.k[off]) << where << " b=" << b << " tok=" << tok;
                  ASSERT_EQ(gv[off], kv.v[off]) << where << " b=" << b << " tok=" << tok;
                }
          for (int b = 0; b < B; ++b)
            for (int lp = 0; lp < (len[b] + P - 1) / P; ++lp)
              for (int h = 0; h < hkv; ++h)
                for (int e = 0; e < d; ++e) {
                  const size_t off = kv.Meta(tables[b][lp], h) + e;
                  ASSERT_EQ(gmn[off], kv.kmin[off]) << where << " b=" << b << " page=" << lp;
                  ASSERT_EQ(gmx[off], kv.kmax[off]) << where << " b=" << b << " page=" << lp;
                }
        }
      }
}

}  // namespace
}  // namespace tinyserve::cuda
