// File: kernels/cpu/attention.h
// Exact decode/prefill attention on the CPU over spans of an fp16 or int8 paged KV cache.
//
// One call handles the n_q query heads that share one KV head (a GQA group) against any set of
// token spans (whole pages, partial pages, or a selection of pages): online softmax in fp32, so
// the result equals softmax over exactly the union of the spans' tokens, whatever their order.
// K/V rows are converted from fp16 with F16C where the CPU has it (chosen at run time); int8
// rows are widened with AVX2; their scales are folded into the query (per-channel K scales, once
// per span) and the softmax weight (V), so an int8 span costs no more passes than an fp16 one.
#pragma once

#include <cstdint>

#include "common/fp16.h"

namespace tinyserve {

enum class KvSpanType : uint8_t { kF16, kInt8 };

// n tokens of K and V rows. kF16 reads k/v; kInt8 reads k8/v8 with element values
// k8[j][i] * k_scales[i] and v8[j][i] * v_scale.
struct KvSpan {
  const fp16_t* k = nullptr;  // [n][head_dim]
  const fp16_t* v = nullptr;  // [n][head_dim]
  int n = 0;
  KvSpanType type = KvSpanType::kF16;
  const int8_t* k8 = nullptr;  // [n][head_dim]
  const int8_t* v8 = nullptr;  // [n][head_dim]
  const float* k_scales = nullptr;  // [head_dim]
  float v_scale = 0.0f;

  static KvSpan Int8(const int8_t* k8, const float* k_scales, const int8_t* v8, float v_scale,
                     int n) {
    KvSpan s;
    s.n = n;
    s.type = KvSpanType::kInt8;
    s.k8 = k8;
    s.v8 = v8;
    s.k_scales = k_scales;
    s.v_scale = v_scale;
    return s;
  }
};

struct AttendOptions {
  float scale = 1.0f;           // usually 1/sqrt(head_dim)
  // Optional: raw scores scale*q·k of every token, [n_q][total tokens] in span order.
  float* scores_out = nullptr;
  // Optional: log-sum-exp of the scores per query head [n_q] (probability = exp(score - lse)).
  float* lse_out = nullptr;
};

// q [n_q][head_dim] fp32, out [n_q][head_dim] fp32. REQUIRES: head_dim % 8 == 0, n_q <= 64.
// With no tokens at all, out is zero (and lse -inf).
void AttendSpans(const float* q, int n_q, int head_dim, const KvSpan* spans, int n_spans,
                 const AttendOptions& options, float* out);

// The same with plain loops (the test oracle and the fallback).
void AttendSpansReference(const float* q, int n_q, int head_dim, const KvSpan* spans,
                          int n_spans, const AttendOptions& options, float* out);

// Decode attention for rows of one sequence and one GQA group at consecutive positions (the
// rows speculative decoding verifies): row r has n_q query heads at q + r·q_stride, attends the
// first limit[r] tokens of the spans (in order) and writes out + r·out_stride ([n_q][head_dim])
// and, when lse_out is set, lse_out[r·n_q + g]. Each row's result is bit-identical to
// AttendSpans over its own tokens (the same spans cut at limit[r]); the K/V are read from
// memory once for all rows. REQUIRES: head_dim % 8 == 0, n_q <= 64.
void AttendSpansRows(const float* q, int64_t q_stride, int n_rows, int n_q, int head_dim,
                     const KvSpan* spans, int n_spans, const int64_t* limit, float scale,
                     float* out, int64_t out_stride, float* lse_out = nullptr);

// Causal attention for a block of consecutive prefill rows of one sequence and one GQA group:
// row r (< n_rows) has n_q query heads at q + r·q_stride ([n_q][head_dim]), sits at position
// pos0 + r and attends tokens [0, pos0 + r] of the spans (taken in order, as one sequence; they
// must hold at least pos0 + n_rows tokens). Writes out + r·out_stride. Each row gets what
// AttendSpans gives it over its own tokens, up to summation order; the block reads the K/V once
// for all its rows instead of once per row. Kernels: AMX (tile unit, split-bf16 products, within
// ~1e-5 of fp32) where MatMul's path is AMX; else AVX-512 (fp32) where the CPU has it and
// attention SIMD is on; else AVX2 (fp32, 8-token tiles) where SIMD attention is on; else
// AttendSpans row by row. TINYSERVE_ATTENTION_ISA=avx512 stops at AVX-512, =avx2 at AVX2, and
// =scalar at the row-by-row plain loops.
// REQUIRES: head_dim % 32 == 0, head_dim <= 256.
void AttendCausalBlock(const float* q, int64_t q_stride, int n_rows, int n_q, int head_dim,
                       int64_t pos0, const KvSpan* spans, int n_spans, float scale, float* out,
                       int64_t out_stride);

// fp16 -> fp32 for n values (F16C when available).
void Fp16ToFloatRow(const fp16_t* src, float* dst, int n);
// fp32 -> fp16 for n values, to nearest even (F16C when available; the same bits as FloatToFp16
// but for NaN payloads).
void FloatToFp16Row(const float* src, fp16_t* dst, int n);
// Widens a per-channel box of fp16 bounds to hold the fp16 values v: mn[i] = v[i] where
// v[i] < mn[i], mx[i] = v[i] where v[i] > mx[i] (NaN changes nothing).
void WidenFp16Box(const fp16_t* v, fp16_t* mn, fp16_t* mx, int n);

// Quest's page score for one query head over an fp16 key box: sum_d max(q_d * kmin_d,
// q_d * kmax_d), the largest q·k any key inside the box can reach (F16C when available).
// REQUIRES: head_dim % 8 == 0.
float BoxScore(const float* q, const fp16_t* kmin, const fp16_t* kmax, int head_dim);

// The sum of BoxScore over the query heads of a GQA group, from the group's query split by sign
// per channel: q_pos[i] = sum over heads of max(q_h[i], 0), q_neg[i] = the same of min(q_h[i], 0).
// Since max(q lo, q hi) = max(q, 0) hi + min(q, 0) lo when lo <= hi, the group's score costs one
// head's (two FMAs per channel); it equals the per-head sum up to rounding.
// REQUIRES: head_dim % 8 == 0.
float BoxScoreSplit(const float* q_pos, const float* q_neg, const fp16_t* kmin, const fp16_t* kmax,
                    int head_dim);

// True when the F16C/AVX2/FMA path is in use (TINYSERVE_CPU_ISA=scalar or
// TINYSERVE_ATTENTION_ISA=scalar turns it off).
bool AttentionUsesSimd();

}  // namespace tinyserve
