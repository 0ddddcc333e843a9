#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tinyserve {
namespace {

struct Case {
  int n_q, d;
  std::vector<int> span_lens;
};

TEST(AttendSpans, MatchesNaiveReferenceOverSpans) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0, 1.5f);
  // Group sizes 1-9 (the SIMD path takes heads in chunks of up to 8), head dims that are and
  // are not multiples of 16, spans shorter and longer than a block and than their neighbours.
  for (const Case& c : {Case{1, 8, {1}}, Case{3, 64, {16, 16, 5}}, Case{4, 128, {7, 33, 16}},
                        Case{9, 64, {16, 1, 16, 16, 16, 40}}, Case{2, 16, {}}, Case{5, 24, {3, 17}},
                        Case{6, 32, {16, 9, 70}}, Case{7, 64, {2, 16}}, Case{8, 64, {16, 16, 3}}}) {
    std::vector<float> q(c.n_q * c.d);
    for (auto& x : q) x = nd(rng);
    std::vector<std::vector<fp16_t>> ks, vs;
    std::vector<KvSpan> spans;
    int total = 0;
    for (int n : c.span_lens) {
      ks.emplace_back(n * c.d);
      vs.emplace_back(n * c.d);
      for (auto& x : ks.back()) x = FloatToFp16(nd(rng));
      for (auto& x : vs.back()) x = FloatToFp16(nd(rng));
      total += n;
    }
    for (size_t i = 0; i < ks.size(); ++i)
      spans.push_back({ks[i].data(), vs[i].data(), c.span_lens[i]});
    std::vector<float> out(c.n_q * c.d, NAN), ref(c.n_q * c.d, NAN);
    std::vector<float> sc(c.n_q * total + 1), sc_ref(c.n_q * total + 1), lse(c.n_q), lse_ref(c.n_q);
    AttendOptions o{1.0f / std::sqrt(static_cast<float>(c.d)), sc.data(), lse.data()};
    AttendOptions r{o.scale, sc_ref.data(), lse_ref.data()};
    AttendSpans(q.data(), c.n_q, c.d, spans.data(), static_cast<int>(spans.size()), o, out.data());
    AttendSpansReference(q.data(), c.n_q, c.d, spans.data(), static_cast<int>(spans.size()), r,
                         ref.data());
    for (int i = 0; i < c.n_q * c.d; ++i) {
      ASSERT_FALSE(std::isnan(out[i]));
      EXPECT_NEAR(out[i], ref[i], 1e-4f * (1 + std::fabs(ref[i]))) << "n_q " << c.n_q << " d " << c.d;
    }
    for (int i = 0; i < c.n_q * total; ++i) EXPECT_NEAR(sc[i], sc_ref[i], 1e-4f * (1 + std::fabs(sc_ref[i])));
    for (int g = 0; g < c.n_q; ++g) {
      if (total == 0) {
        EXPECT_TRUE(std::isinf(lse[g]));
      } else {
        EXPECT_NEAR(lse[g], lse_ref[g], 1e-4f * (1 + std::fabs(lse_ref[g])));
      }
    }
  }
}

TEST(AttendSpans, OrderOfSpansDoesNotMatter) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  const int d = 64, n = 16;
  std::vector<fp16_t> k1(n * d), v1(n * d), k2(n * d), v2(n * d);
  for (auto* b : {&k1, &v1, &k2, &v2})
    for (auto& x : *b) x = FloatToFp16(nd(rng));
  std::vector<float> q(d);
  for (auto& x : q) x = nd(rng);
  KvSpan a[2] = {{k1.data(), v1.data(), n}, {k2.data(), v2.data(), n}};
  KvSpan b[2] = {a[1], a[0]};
  std::vector<float> o1(d), o2(d);
  AttendOptions opt{0.125f, nullptr, nullptr};
  AttendSpans(q.data(), 1, d, a, 2, opt, o1.data());
  AttendSpans(q.data(), 1, d, b, 2, opt, o2.data());
  for (int i = 0; i < d; ++i) EXPECT_NEAR(o1[i], o2[i], 1e-5f);
}

// int8 spans (mixed with fp16 ones, odd lengths) against the reference, SIMD and scalar alike
// (the scalar path is what TINYSERVE_ATTENTION_ISA=scalar runs).
TEST(AttendSpans, Int8SpansMatchReference) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0, 1.5f);
  std::uniform_int_distribution<int> qd(-127, 127);
  for (const Case& c : {Case{1, 8, {1}}, Case{3, 64, {16, 16, 5}}, Case{4, 128, {7, 33, 16}},
                        Case{9, 64, {16, 1, 16, 16, 16, 40}}, Case{5, 24, {3, 17}}}) {
    std::vector<float> q(c.n_q * c.d);
    for (auto& x : q) x = nd(rng);
    std::vector<std::vector<int8_t>> ks, vs;
    std::vector<std::vector<fp16_t>> kf, vf;
    std::vector<std::vector<float>> kscales;
    std::vector<KvSpan> spans;
    int total = 0;
    for (size_t i = 0; i < c.span_lens.size(); ++i) {
      const int n = c.span_lens[i];
      total += n;
      if (i % 3 == 2) {  // every third span fp16: spans of both types in one call
        kf.emplace_back(n * c.d);
        vf.emplace_back(n * c.d);
        for (auto& x : kf.back()) x = FloatToFp16(nd(rng));
        for (auto& x : vf.back()) x = FloatToFp16(nd(rng));
        KvSpan s;
        s.k = kf.back().data();
        s.v = vf.back().data();
        s.n = n;
        spans.push_back(s);
        continue;
      }
      ks.emplace_back(n * c.d);
      vs.emplace_back(n * c.d);
      for (auto& x : ks.back()) x = static_cast<int8_t>(qd(rng));
      for (auto& x : vs.back()) x = static_cast<int8_t>(qd(rng));
      kscales.emplace_back(c.d);
      for (auto& x : kscales.back()) x = 0.005f + 0.03f * std::fabs(nd(rng));
      spans.push_back(KvSpan::Int8(ks.back().data(), kscales.back().data(), vs.back().data(),
                                   0.015f + 0.002f * i, n));
    }
    std::vector<float> out(c.n_q * c.d, NAN), ref(c.n_q * c.d, NAN);
    std::vector<float> sc(c.n_q * total + 1), sc_ref(c.n_q * total + 1), lse(c.n_q), lse_ref(c.n_q);
    AttendOptions o{1.0f / std::sqrt(static_cast<float>(c.d)), sc.data(), lse.data()};
    AttendOptions r{o.scale, sc_ref.data(), lse_ref.data()};
    AttendSpans(q.data(), c.n_q, c.d, spans.data(), static_cast<int>(spans.size()), o, out.data());
    AttendSpansReference(q.data(), c.n_q, c.d, spans.data(), static_cast<int>(spans.size()), r,
                         ref.data());
    for (int i = 0; i < c.n_q * c.d; ++i) {
      ASSERT_FALSE(std::isnan(out[i]));
      EXPECT_NEAR(out[i], ref[i], 1e-4f * (1 + std::fabs(ref[i]))) << "n_q " << c.n_q << " d " << c.d;
    }
    for (int i = 0; i < c.n_q * total; ++i)
      EXPECT_NEAR(sc[i], sc_ref[i], 1e-4f * (1 + std::fabs(sc_ref[i])));
    for (int g = 0; g < c.n_q; ++g) EXPECT_NEAR(lse[g], lse_ref[g], 1e-4f * (1 + std::fabs(lse_ref[g])));
  }
}

// Rows verified together: each row bit for bit what AttendSpans gives over the spans cut at the
// row's limit (fp16 and int8 spans mixed; limits inside a block, at span ends, 0, and rows that
// stop spans before the longest one).
TEST(AttendSpansRows, EachRowIsBitIdenticalToAttendSpansOverItsTokens) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0, 1.5f);
  std::uniform_int_distribution<int> qd(-127, 127);
  for (int n_q : {1, 3, 8, 9})
    for (int d : {8, 64}) {
      const std::vector<int> lens = {16, 16, 40, 7};
      std::vector<std::vector<fp16_t>> kf, vf;
      std::vector<std::vector<int8_t>> k8, v8;
      std::vector<std::vector<float>> ksc;
      std::vector<KvSpan> spans;
      for (size_t i = 0; i < lens.size(); ++i) {
        const int n = lens[i];
        if (i == 1) {  // one int8 span
          k8.emplace_back(n * d);
          v8.emplace_back(n * d);
          ksc.emplace_back(d);
          for (auto& x : k8.back()) x = static_cast<int8_t>(qd(rng));
          for (auto& x : v8.back()) x = static_cast<int8_t>(qd(rng));
          for (auto& x : ksc.back()) x = 0.005f + 0.03f * std::fabs(nd(rng));
          spans.push_back(
              KvSpan::Int8(k8.back().data(), ksc.back().data(), v8.back().data(), 0.02f, n));
          continue;
        }
        kf.emplace_back(n * d);
        vf.emplace_back(n * d);
        for (auto& x : kf.back()) x = FloatToFp16(nd(rng));
        for (auto& x : vf.back()) x = FloatToFp16(nd(rng));
        spans.push_back({kf.back().data(), vf.back().data(), n});
      }
      const std::vector<int64_t> limit = {0, 5, 16, 17, 33, 64, 65, 79};
      const int rows = static_cast<int>(limit.size());
      const int64_t stride = n_q * d + 8;  // rows need not be packed
      std::vector<float> q(rows * stride);
      for (auto& x : q) x = nd(rng);
      std::vector<float> out(rows * stride, NAN), lse(rows * n_q, NAN);
      const float scale = 1.0f / std::sqrt(static_cast<float>(d));
      AttendSpansRows(q.data(), stride, rows, n_q, d, spans.data(), static_cast<int>(spans.size()),
                      limit.data(), scale, out.data(), stride, lse.data());
      for (int r = 0; r < rows; ++r) {
        std::vector<KvSpan> own;
        int64_t left = limit[r];
        for (const KvSpan& sp : spans) {
          if (left <= 0) break;
          own.push_back(sp);
          own.back().n = static_cast<int>(std::min<int64_t>(sp.n, left));
          left -= own.back().n;
        }
        std::vector<float> want(n_q * d, NAN), want_lse(n_q, NAN);
        AttendOptions o;
        o.scale = scale;
        o.lse_out = want_lse.data();
        AttendSpans(&q[r * stride], n_q, d, own.data(), static_cast<int>(own.size()), o,
                    want.data());
        for (int i = 0; i < n_q * d; ++i)
          ASSERT_EQ(out[r * stride + i], want[i]) << "n_q " << n_q << " d " << d << " row " << r;
        for (int g = 0; g < n_q; ++g) ASSERT_EQ(lse[r * n_q + g], want_lse[g]) << "row " << r;
      }
    }
}

// An int8 span whose values equal an fp16 span's (integers times a power of two, exact in both)
// gives the same attention.
TEST(AttendSpans, Int8AndFp16OfTheSameValuesAgree) {
  std::mt19937 rng(13);
  std::uniform_int_distribution<int> qd(-127, 127);
  std::normal_distribution<float> nd;
  const int d = 64, n = 37;
  const float vs = 1.0f / 64;
  std::vector<float> kscales(d);
  for (int i = 0; i < d; ++i) kscales[i] = i % 2 ? 1.0f / 32 : 1.0f / 128;  // powers of two
  std::vector<int8_t> k8(n * d), v8(n * d);
  std::vector<fp16_t> kf(n * d), vf(n * d);
  for (int i = 0; i < n * d; ++i) {
    k8[i] = static_cast<int8_t>(qd(rng));
    v8[i] = static_cast<int8_t>(qd(rng));
    kf[i] = FloatToFp16(k8[i] * kscales[i % d]);
    vf[i] = FloatToFp16(v8[i] * vs);
  }
  std::vector<float> q(2 * d);
  for (auto& x : q) x = nd(rng);
  KvSpan a = KvSpan::Int8(k8.data(), kscales.data(), v8.data(), vs, n);
  KvSpan b;
  b.k = kf.data();
  b.v = vf.data();
  b.n = n;
  std::vector<float> o1(2 * d), o2(2 * d);
  AttendOptions opt{0.125f, nullptr, nullptr};
  AttendSpans(q.data(), 2, d, &a, 1, opt, o1.data());
  AttendSpans(q.data(), 2, d, &b, 1, opt, o2.data());
  for (int i = 0; i < 2 * d; ++i) EXPECT_NEAR(o1[i], o2[i], 1e-5f * (1 + std::fabs(o2[i])));
}

// The group score from the sign-split query equals the sum of the heads' box scores, and it
// bounds the group's summed q·k of every key inside the box.
// A block of prefill rows against the per-row reference over each row's own tokens: fp16 and
// int8 spans of page size and odd sizes, blocks starting at 0 and mid-sequence, rows from 1 to
// more than the kernel's register block, groups 1-8, head dims 32-256.
TEST(AttendCausalBlock, EachRowMatchesTheReferenceOverItsOwnTokens) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0, 1.5f);
  struct BlockCase {
    int n_rows, n_q, d;
    int64_t pos0;
    std::vector<int> span_lens;
    bool int8;
  };
  for (const BlockCase& c :
       {BlockCase{1, 3, 64, 0, {16}, false}, BlockCase{7, 3, 64, 0, {16}, false},
        BlockCase{32, 3, 64, 0, {16, 16}, false},
        BlockCase{32, 3, 64, 40, {16, 16, 16, 16, 8}, false},
        BlockCase{5, 8, 128, 21, {16, 10}, false}, BlockCase{9, 1, 32, 3, {5, 16, 7}, false},
        BlockCase{17, 4, 64, 30, {16, 16, 16}, true}, BlockCase{3, 2, 96, 61, {64, 3}, false},
        BlockCase{32, 3, 64, 200, std::vector<int>(15, 16), false},
        BlockCase{20, 1, 256, 37, {16, 16, 16, 16}, false}}) {
    int total = 0;
    for (int n : c.span_lens) total += n;
    ASSERT_GE(total, c.pos0 + c.n_rows);
    std::vector<std::vector<fp16_t>> ks, vs;
    std::vector<std::vector<int8_t>> k8s, v8s;
    std::vector<float> kscale(c.d);
    for (auto& x : kscale) x = 0.01f + 0.02f * std::fabs(nd(rng));
    std::vector<KvSpan> spans;
    for (int n : c.span_lens) {
      if (c.int8) {
        k8s.emplace_back(n * c.d);
        v8s.emplace_back(n * c.d);
        for (auto& x : k8s.back()) x = static_cast<int8_t>(std::clamp(nd(rng) * 40, -127.f, 127.f));
        for (auto& x : v8s.back()) x = static_cast<int8_t>(std::clamp(nd(rng) * 40, -127.f, 127.f));
        spans.push_back(
            KvSpan::Int8(k8s.back().data(), kscale.data(), v8s.back().data(), 0.03f, n));
      } else {
        ks.emplace_back(n * c.d);
        vs.emplace_back(n * c.d);
        for (auto& x : ks.back()) x = FloatToFp16(nd(rng));
        for (auto& x : vs.back()) x = FloatToFp16(nd(rng));
        spans.push_back({ks.back().data(), vs.back().data(), n});
      }
    }
    // Rows padded apart (stride > n_q·d) to check the strides.
    const int64_t stride = c.n_q * c.d + 8;
    std::vector<float> q(c.n_rows * stride);
    for (auto& x : q) x = nd(rng);
    std::vector<float> out(c.n_rows * stride, NAN);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    AttendCausalBlock(q.data(), stride, c.n_rows, c.n_q, c.d, c.pos0, spans.data(),
                      static_cast<int>(spans.size()), scale, out.data(), stride);
    for (int r = 0; r < c.n_rows; ++r) {
      std::vector<KvSpan> own;
      int64_t left = c.pos0 + r + 1;
      for (const KvSpan& sp : spans) {
        if (left <= 0) break;
        own.push_back(sp);
        own.back().n = static_cast<int>(std::min<int64_t>(sp.n, left));
        left -= own.back().n;
      }
      std::vector<float> ref(c.n_q * c.d);
      AttendOptions o;
      o.scale = scale;
      AttendSpansReference(q.data() + r * stride, c.n_q, c.d, own.data(),
                           static_cast<int>(own.size()), o, ref.data());
      for (int i = 0; i < c.n_q * c.d; ++i) {
        ASSERT_NEAR(out[r * stride + i], ref[i], 1e-4f * (1 + std::fabs(ref[i])))
            << "rows " << c.n_rows << " n_q " << c.n_q << " d " << c.d << " pos0 " << c.pos0
            << " row " << r << " element " << i;
      }
    }
  }
}

TEST(BoxScoreSplit, EqualsTheSumOfTheHeadsBoxScores) {
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0, 1.5f);
  for (int d : {8, 64, 128})
    for (int group : {1, 3, 8}) {
      std::vector<float> q(group * d), q_pos(d, 0.0f), q_neg(d, 0.0f);
      for (auto& x : q) x = nd(rng);
      for (int g = 0; g < group; ++g)
        for (int i = 0; i < d; ++i) (q[g * d + i] > 0 ? q_pos : q_neg)[i] += q[g * d + i];
      std::vector<fp16_t> keys(16 * d), mn(d), mx(d);
      for (auto& x : keys) x = FloatToFp16(nd(rng));
      for (int i = 0; i < d; ++i) {
        float lo = INFINITY, hi = -INFINITY;
        for (int j = 0; j < 16; ++j) {
          lo = std::min(lo, Fp16ToFloat(keys[j * d + i]));
          hi = std::max(hi, Fp16ToFloat(keys[j * d + i]));
        }
        mn[i] = FloatToFp16(lo);
        mx[i] = FloatToFp16(hi);
      }
      float per_head = 0;
      for (int g = 0; g < group; ++g) per_head += BoxScore(&q[g * d], mn.data(), mx.data(), d);
      const float split = BoxScoreSplit(q_pos.data(), q_neg.data(), mn.data(), mx.data(), d);
      EXPECT_NEAR(split, per_head, 1e-4f * (1 + std::fabs(per_head))) << "d " << d;
      for (int j = 0; j < 16; ++j) {
        float dot = 0;
        for (int g = 0; g < group; ++g)
          for (int i = 0; i < d; ++i) dot += q[g * d + i] * Fp16ToFloat(keys[j * d + i]);
        EXPECT_GE(split + 1e-4f * (1 + std::fabs(dot)), dot);
      }
    }
}

}  // namespace
}  // namespace tinyserve
