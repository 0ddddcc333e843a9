#include "worker/runner/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"
#include "common/timer.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/dequant.h"
#include "worker/kv/kv_span.h"
#include "worker/model/lora_adapter.h"
#include "worker/model/weight_source.h"
#include "worker/tp/communicator.h"

namespace tinyserve {
namespace {

absl::StatusOr<Matrix> LoadMatrix(const WeightSource& src, const std::string& name,
                                  int64_t rows, int64_t cols) {
  TS_ASSIGN_OR_RETURN(TensorRef t, src.Get(name));
  if (t.ne.size() != 2 || t.ne[0] != cols || t.ne[1] != rows)
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': expected shape [", cols,
                                                   ", ", rows, "], got ",
                                                   t.ne.size() == 2 ? absl::StrCat("[", t.ne[0], ", ", t.ne[1], "]")
                                                                    : absl::StrCat(t.ne.size(), " dims")));
  return MatrixView(t.type, rows, cols, t.data);
}

absl::StatusOr<std::vector<float>> LoadVector(const WeightSource& src, const std::string& name,
                                              int64_t n) {
  TS_ASSIGN_OR_RETURN(TensorRef t, src.Get(name));
  int64_t count = 1;
  for (int64_t e : t.ne) count *= e;
  if (count != n)
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "': expected ", n, " elements, got ", count));
  std::vector<float> out(n);
  TS_RETURN_IF_ERROR(DequantizeRow(t.type, t.data, out.data(), n));
  return out;
}

std::string Blk(int i, const char* what) { return absl::StrCat("blk.", i, ".", what); }

// y[o] += sum_j c[j] bt[j][o] for o < n_out (a LoRA update's B product for one row): blocks of
// outputs accumulate all r terms in L1 and touch y once.
template <int kTag>
void LoraExpandRowT(const float* c, int64_t r, const float* bt, int64_t n_out, float* y) {
  constexpr int64_t kBlock = 256;
  float acc[kBlock];
  for (int64_t o0 = 0; o0 < n_out; o0 += kBlock) {
    const int64_t m = std::min(kBlock, n_out - o0);
    for (int64_t o = 0; o < m; ++o) acc[o] = y[o0 + o];
    for (int64_t j = 0; j < r; ++j) {
      const float cj = c[j];
      const float* b = bt + j * n_out + o0;
      for (int64_t o = 0; o < m; ++o) acc[o] += cj * b[o];
    }
    for (int64_t o = 0; o < m; ++o) y[o0 + o] = acc[o];
  }
}

// The runner's sources are built for the baseline ISA; with GCC on x86-64 the same loop is also
// compiled for AVX2+FMA and AVX-512, used when ActiveCpuIsa() (TINYSERVE_CPU_ISA) allows.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target("avx2,fma"))) void LoraExpandRowAvx2(const float* c, int64_t r,
                                                           const float* bt, int64_t n_out,
                                                           float* y) {
  LoraExpandRowT<1>(c, r, bt, n_out, y);
}
__attribute__((target("avx512f,avx2,fma"))) void LoraExpandRowAvx512(const float* c, int64_t r,
                                                                     const float* bt, int64_t n_out,
                                                                     float* y) {
  LoraExpandRowT<2>(c, r, bt, n_out, y);
}
#endif

using LoraExpandFn = void (*)(const float*, int64_t, const float*, int64_t, float*);
LoraExpandFn PickLoraExpand() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  const CpuIsa isa = ActiveCpuIsa();
  if (isa >= CpuIsa::kAvx512) return LoraExpandRowAvx512;
  if (isa >= CpuIsa::kAvx2) return LoraExpandRowAvx2;
#endif
  return LoraExpandRowT<0>;
}

}  // namespace

absl::StatusOr<std::vector<float>> TensorBlock(const TensorRef& t, int64_t r0, int64_t r1,
                                               int64_t c0, int64_t c1) {
  const int64_t cols = t.ne[0];
  const size_t row_bytes = GgmlRowBytes(t.type, cols);
  std::vector<float> row(cols), out;
  out.reserve(static_cast<size_t>((r1 - r0) * (c1 - c0)));
  for (int64_t r = r0; r < r1; ++r) {
    absl::Status st =
        DequantizeRow(t.type, t.data + static_cast<size_t>(r) * row_bytes, row.data(), cols);
    if (!st.ok())
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': ", st.message()));
    for (int64_t c = c0; c < c1; ++c)
      if (!std::isfinite(row[c]))
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", t.name, "': row ", r, " holds ", row[c], " (not finite)"));
    out.insert(out.end(), row.begin() + c0, row.begin() + c1);
  }
  return out;
}

TransformerRunner::ShardRanges TransformerRunner::Shard() const {
  const int64_t hd = config_.head_dim;
  ShardRanges s;
  s.qd = config_.n_heads * hd;
  s.kd = config_.n_kv_heads * hd;
  s.q0 = head_start_ * hd;
  s.q1 = s.q0 + heads_local_ * hd;
  s.k0 = kv_start_ * hd;
  s.k1 = s.k0 + kv_local_ * hd;
  s.f0 = int64_t{options_.rank} * ffn_local_;
  s.f1 = s.f0 + ffn_local_;
  return s;
}

absl::StatusOr<int> TransformerRunner::AddLora(const LoraAdapter& adapter) {
  TS_ASSIGN_OR_RETURN(PreparedLora lora, PrepareLora(adapter));
  return InstallLora(std::move(lora));
}

int TransformerRunner::InstallLora(PreparedLora lora) {
  loras_.push_back(std::move(lora));
  return static_cast<int>(loras_.size());
}

void TransformerRunner::RemoveLora(int id) {
  if (id >= 1 && id <= num_loras()) PreparedLora().swap(loras_[id - 1]);
}

absl::StatusOr<TransformerRunner::PreparedLora> TransformerRunner::PrepareLora(
    const LoraAdapter& adapter) const {
  const ModelConfig& c = config_;
  const auto [qd, kd, q0, q1, k0, k1, f0, f1] = Shard();
  const int64_t D = c.dim;
  // The update of `weight` restricted to output rows [o0, o1) (B's rows) and input columns
  // [i0, i1) (A's columns).
  auto delta = [&](const std::string& weight, int64_t o0, int64_t o1, int64_t i0,
                   int64_t i1) -> absl::StatusOr<LoraDelta> {
    const LoraPair* p = adapter.Find(weight);
    if (p == nullptr) return LoraDelta{};
    const int64_t r = p->rank();
    TS_ASSIGN_OR_RETURN(std::vector<float> a, TensorBlock(p->a, 0, r, i0, i1));
    TS_ASSIGN_OR_RETURN(std::vector<float> b, TensorBlock(p->b, o0, o1, 0, r));
    const float scale = p->scale;
    const int64_t n_out = o1 - o0;
    std::vector<float> bt(static_cast<size_t>(r * n_out));
    for (int64_t o = 0; o < n_out; ++o)
      for (int64_t j = 0; j < r; ++j) bt[j * n_out + o] = scale * b[o * r + j];
    return LoraDelta{MatrixFromFloats(a.data(), r, i1 - i0), std::move(bt)};
  };
  std::vector<LoraLayer> layers(c.n_layers);
  for (int i = 0; i < c.n_layers; ++i) {
    LoraLayer& L = layers[i];
    if (c.arch == Arch::kGpt2) {
      const std::string qkv = Blk(i, "attn_qkv.weight");
      TS_ASSIGN_OR_RETURN(L.q, delta(qkv, q0, q1, 0, D));
      TS_ASSIGN_OR_RETURN(L.k, delta(qkv, qd + k0, qd + k1, 0, D));
      TS_ASSIGN_OR_RETURN(L.v, delta(qkv, qd + kd + k0, qd + kd + k1, 0, D));
    } else {
      TS_ASSIGN_OR_RETURN(L.q, delta(Blk(i, "attn_q.weight"), q0, q1, 0, D));
      TS_ASSIGN_OR_RETURN(L.k, delta(Blk(i, "attn_k.weight"), k0, k1, 0, D));
      TS_ASSIGN_OR_RETURN(L.v, delta(Blk(i, "attn_v.weight"), k0, k1, 0, D));
      TS_ASSIGN_OR_RETURN(L.gate, delta(Blk(i, "ffn_gate.weight"), f0, f1, 0, D));
    }
    TS_ASSIGN_OR_RETURN(L.up, delta(Blk(i, "ffn_up.weight"), f0, f1, 0, D));
    // Row-parallel weights: this rank's input columns; the all-reduce sums the parts.
    TS_ASSIGN_OR_RETURN(L.o, delta(Blk(i, "attn_output.weight"), 0, D, q0, q1));
    TS_ASSIGN_OR_RETURN(L.down, delta(Blk(i, "ffn_down.weight"), 0, D, f0, f1));
  }
  return layers;
}

absl::StatusOr<std::unique_ptr<TransformerRunner>> TransformerRunner::Create(
    const WeightSource& source, const RunnerOptions& options) {
  std::unique_ptr<TransformerRunner> r(new TransformerRunner());
  r->options_ = options;
  r->config_ = source.config();
  const ModelConfig& c = r->config_;
  const int ws = options.world_size, rank = options.rank;
  if (ws < 1 || rank < 0 || rank >= ws)
    return absl::InvalidArgumentError(absl::StrCat("bad rank ", rank, " of ", ws));
  if (ws > 1 && options.comm == nullptr)
    return absl::InvalidArgumentError("world_size > 1 needs a communicator");
  if (c.n_heads % ws != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("tensor-parallel size ", ws, " does not divide ", c.n_heads, " heads"));
  if (c.ffn_dim % ws != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("tensor-parallel size ", ws, " does not divide the MLP size ", c.ffn_dim));
  r->heads_local_ = c.n_heads / ws;
  r->head_start_ = rank * r->heads_local_;
  if (c.n_kv_heads % ws == 0) {
    r->kv_local_ = c.n_kv_heads / ws;
    r->kv_start_ = rank * r->kv_local_;
  } else if (ws % c.n_kv_heads == 0) {
    r->kv_local_ = 1;  // KV heads replicated: ws / n_kv ranks share each
    r->kv_start_ = rank / (ws / c.n_kv_heads);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("tensor-parallel size ", ws,
                                                   " and KV heads ", c.n_kv_heads,
                                                   ": neither divides the other"));
  }
  r->group_ = c.n_heads / c.n_kv_heads;
  r->ffn_local_ = c.ffn_dim / ws;
  TS_RETURN_IF_ERROR(r->Load(source));
  const int max_pos = options.max_positions > 0 ? options.max_positions : c.max_context;
  if (c.rope_style != RopeStyle::kNone)
    r->rope_ = std::make_unique<RopeTable>(c.head_dim, max_pos, c.rope_theta, c.rope_freq_scale,
                                           c.rope_freq_factors, c.rope_attn_factor);
  if (c.rope_style != RopeStyle::kNone && c.sliding_window > 0)
    r->rope_swa_ = std::make_unique<RopeTable>(c.head_dim, max_pos, c.rope_theta_swa);
  return r;
}

absl::Status TransformerRunner::Load(const WeightSource& src) {
  const ModelConfig& c = config_;
  const int D = c.dim;
  const bool gpt2 = c.arch == Arch::kGpt2;
  const bool first = options_.rank == 0;
  // Matrices per (file type, run type), for the load summary.
  std::map<std::pair<std::string_view, std::string_view>, int> kinds;
  auto prep = [&](Matrix m) -> absl::StatusOr<Matrix> {
    const GgmlType from = m.type;
    const bool view = m.storage == nullptr;
    const uint8_t* data = m.data;
    const size_t bytes = static_cast<size_t>(m.rows) * m.row_bytes;
    TS_ASSIGN_OR_RETURN(Matrix p, PrepareMatrix(std::move(m)));
    // Repacked or converted from the file's mapping: its pages need not stay in memory (the
    // token embedding's rows come back one by one as lookups read them).
    if (view && p.data != data) src.DropPages(data, bytes);
    weight_bytes_ += static_cast<int64_t>(p.row_bytes) * p.rows;
    ++kinds[{GgmlTypeName(from), GgmlTypeName(p.type)}];
    return p;
  };
  // Rows [r0, r1) of a vector, or all when it is absent and optional.
  auto vec_slice = [&](const std::string& name, int64_t n, int64_t r0,
                       int64_t r1) -> absl::StatusOr<std::vector<float>> {
    if (!src.Has(name)) return std::vector<float>();
    TS_ASSIGN_OR_RETURN(std::vector<float> v, LoadVector(src, name, n));
    return std::vector<float>(v.begin() + r0, v.begin() + r1);
  };

  TS_ASSIGN_OR_RETURN(token_embd_, LoadMatrix(src, "token_embd.weight", c.vocab_size, D));
  if (gpt2) {
    TS_ASSIGN_OR_RETURN(position_embd_,
                        LoadMatrix(src, "position_embd.weight", c.max_context, D));
  }
  TS_ASSIGN_OR_RETURN(output_norm_w_, LoadVector(src, "output_norm.weight", D));
  if (gpt2) {
    TS_ASSIGN_OR_RETURN(output_norm_b_, LoadVector(src, "output_norm.bias", D));
  }
  if (!c.tied_embeddings && src.Has("output.weight")) {
    TS_ASSIGN_OR_RETURN(Matrix out, LoadMatrix(src, "output.weight", c.vocab_size, D));
    TS_ASSIGN_OR_RETURN(output_, prep(std::move(out)));
  } else {
    TS_ASSIGN_OR_RETURN(output_, prep(token_embd_));
  }

  const auto [qd, kd, q0, q1, k0, k1, f0, f1] = Shard();
  layers_.resize(c.n_layers);
  for (int i = 0; i < c.n_layers; ++i) {
    Layer& L = layers_[i];
    TS_ASSIGN_OR_RETURN(L.attn_norm_w, LoadVector(src, Blk(i, "attn_norm.weight"), D));
    TS_ASSIGN_OR_RETURN(L.ffn_norm_w, LoadVector(src, Blk(i, "ffn_norm.weight"), D));
    if (c.post_norms) {
      TS_ASSIGN_OR_RETURN(L.post_attn_norm,
                          LoadVector(src, Blk(i, "post_attention_norm.weight"), D));
      TS_ASSIGN_OR_RETURN(L.post_ffn_norm, LoadVector(src, Blk(i, "post_ffw_norm.weight"), D));
    }
    if (gpt2) {
      TS_ASSIGN_OR_RETURN(L.attn_norm_b, LoadVector(src, Blk(i, "attn_norm.bias"), D));
      TS_ASSIGN_OR_RETURN(L.ffn_norm_b, LoadVector(src, Blk(i, "ffn_norm.bias"), D));
      TS_ASSIGN_OR_RETURN(Matrix qkv, LoadMatrix(src, Blk(i, "attn_qkv.weight"), qd + 2 * kd, D));
      TS_ASSIGN_OR_RETURN(L.wq, prep(SliceRows(qkv, q0, q1)));
      TS_ASSIGN_OR_RETURN(L.wk, prep(SliceRows(qkv, qd + k0, qd + k1)));
      TS_ASSIGN_OR_RETURN(L.wv, prep(SliceRows(qkv, qd + kd + k0, qd + kd + k1)));
      TS_ASSIGN_OR_RETURN(std::vector<float> b,
                          LoadVector(src, Blk(i, "attn_qkv.bias"), qd + 2 * kd));
      L.bq.assign(b.begin() + q0, b.begin() + q1);
      L.bk.assign(b.begin() + qd + k0, b.begin() + qd + k1);
      L.bv.assign(b.begin() + qd + kd + k0, b.begin() + qd + kd + k1);
    } else {
      TS_ASSIGN_OR_RETURN(Matrix wq, LoadMatrix(src, Blk(i, "attn_q.weight"), qd, D));
      TS_ASSIGN_OR_RETURN(Matrix wk, LoadMatrix(src, Blk(i, "attn_k.weight"), kd, D));
      TS_ASSIGN_OR_RETURN(Matrix wv, LoadMatrix(src, Blk(i, "attn_v.weight"), kd, D));
      TS_ASSIGN_OR_RETURN(L.wq, prep(options_.world_size == 1 ? wq : SliceRows(wq, q0, q1)));
      TS_ASSIGN_OR_RETURN(L.wk, prep(options_.world_size == 1 ? wk : SliceRows(wk, k0, k1)));
      TS_ASSIGN_OR_RETURN(L.wv, prep(options_.world_size == 1 ? wv : SliceRows(wv, k0, k1)));
      TS_ASSIGN_OR_RETURN(L.bq, vec_slice(Blk(i, "attn_q.bias"), qd, q0, q1));
      TS_ASSIGN_OR_RETURN(L.bk, vec_slice(Blk(i, "attn_k.bias"), kd, k0, k1));
      TS_ASSIGN_OR_RETURN(L.bv, vec_slice(Blk(i, "attn_v.bias"), kd, k0, k1));
      if (c.qk_norm) {
        TS_ASSIGN_OR_RETURN(L.q_norm, LoadVector(src, Blk(i, "attn_q_norm.weight"), c.head_dim));
        TS_ASSIGN_OR_RETURN(L.k_norm, LoadVector(src, Blk(i, "attn_k_norm.weight"), c.head_dim));
      }
    }
    TS_ASSIGN_OR_RETURN(Matrix wo, LoadMatrix(src, Blk(i, "attn_output.weight"), D, qd));
    if (options_.world_size == 1) {
      TS_ASSIGN_OR_RETURN(L.wo, prep(wo));
    } else {
      TS_ASSIGN_OR_RETURN(Matrix s, SliceCols(wo, q0, q1));
      TS_ASSIGN_OR_RETURN(L.wo, prep(s));
    }
    if (first) {
      TS_ASSIGN_OR_RETURN(L.bo, vec_slice(Blk(i, "attn_output.bias"), D, 0, D));
    }
    if (!gpt2) {
      TS_ASSIGN_OR_RETURN(Matrix g, LoadMatrix(src, Blk(i, "ffn_gate.weight"), c.ffn_dim, D));
      TS_ASSIGN_OR_RETURN(L.w_gate, prep(options_.world_size == 1 ? g : SliceRows(g, f0, f1)));
    }
    TS_ASSIGN_OR_RETURN(Matrix u, LoadMatrix(src, Blk(i, "ffn_up.weight"), c.ffn_dim, D));
    TS_ASSIGN_OR_RETURN(L.w_up, prep(options_.world_size == 1 ? u : SliceRows(u, f0, f1)));
    TS_ASSIGN_OR_RETURN(L.b_up, vec_slice(Blk(i, "ffn_up.bias"), c.ffn_dim, f0, f1));
    TS_ASSIGN_OR_RETURN(Matrix dn, LoadMatrix(src, Blk(i, "ffn_down.weight"), D, c.ffn_dim));
    if (options_.world_size == 1) {
      TS_ASSIGN_OR_RETURN(L.w_down, prep(dn));
    } else {
      TS_ASSIGN_OR_RETURN(Matrix s, SliceCols(dn, f0, f1));
      TS_ASSIGN_OR_RETURN(L.w_down, prep(s));
    }
    if (first) {
      TS_ASSIGN_OR_RETURN(L.b_down, vec_slice(Blk(i, "ffn_down.bias"), D, 0, D));
    }
  }
  // "weights 99 MiB: 211 Q4_1, 5 Q4_K->Q4_1, 5 Q6_K->Q8_0": what the products run on, and
  // which file types were converted at load (weight_convert.h).
  std::string summary;
  for (const auto& [k, n] : kinds) {
    absl::StrAppend(&summary, summary.empty() ? "" : ", ", n, " ", std::string(k.first));
    if (k.first != k.second) absl::StrAppend(&summary, "->", std::string(k.second));
  }
  TS_LOG(INFO) << "weights " << weight_bytes_ / (1 << 20) << " MiB: " << summary;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<LoraInfo>> AddLoras(const std::vector<LoraModule>& modules,
                                               TransformerRunner* runner) {
  return AddLoras(modules, runner->config(),
                  [runner](const LoraAdapter& a) { return runner->AddLora(a); });
}

absl::StatusOr<std::vector<LoraInfo>> AddLoras(
    const std::vector<LoraModule>& modules, const ModelConfig& base,
    const std::function<absl::StatusOr<int>(const LoraAdapter&)>& add) {
  std::vector<LoraInfo> infos;
  for (const LoraModule& m : modules) {
    for (const LoraInfo& i : infos)
      if (i.name == m.name)
        return absl::InvalidArgumentError(
            absl::StrCat("--lora: adapter name '", m.name, "' is given twice"));
    TS_ASSIGN_OR_RETURN(std::unique_ptr<LoraAdapter> a, LoraAdapter::Open(m.name, m.path, base));
    TS_RETURN_IF_ERROR(add(*a).status());
    infos.push_back({m.name, m.path, a->max_rank(), a->alpha(), static_cast<int>(a->num_pairs())});
  }
  return infos;
}

KvCacheConfig TransformerRunner::MakeKvConfig(int page_size, int64_t num_pages) const {
  KvCacheConfig k;
  k.n_layers = config_.n_layers;
  k.n_kv_heads = kv_local_;
  k.head_dim = config_.head_dim;
  k.page_size = page_size;
  k.num_pages = num_pages;
  return k;
}

void TransformerRunner::Norm(const float* x, const std::vector<float>& w,
                             const std::vector<float>& b, float* y) const {
  if (config_.arch == Arch::kGpt2) {
    LayerNorm(x, w.data(), b.empty() ? nullptr : b.data(), config_.dim, config_.norm_eps, y);
  } else {
    RmsNorm(x, w.data(), config_.dim, config_.norm_eps, y);
  }
}

absl::Status TransformerRunner::AllReduce(float* data, size_t n) {
  if (options_.world_size == 1) return absl::OkStatus();
  return options_.comm->AllReduceSum(data, n);
}

static void AddBias(float* y, const std::vector<float>& b, int64_t rows, int64_t n) {
  if (b.empty()) return;
  for (int64_t t = 0; t < rows; ++t) AddInPlace(y + t * n, b.data(), static_cast<int>(n));
}

absl::Status TransformerRunner::Forward(const std::vector<SeqInput>& batch, PagedKvCache* kv,
                                        std::vector<float>* logits) {
  const ModelConfig& c = config_;
  const int D = c.dim, hd = c.head_dim;
  const int qdim = heads_local_ * hd, kdim = kv_local_ * hd;
  timings_ = ForwardTimings();
  Stopwatch total;
  // Rows of the activation matrices: sequence s owns rows [row0[s], row0[s] + n).
  bool any_lora = false;
  std::vector<int> row0(batch.size() + 1, 0);
  for (size_t s = 0; s < batch.size(); ++s) {
    const SeqInput& in = batch[s];
    if (in.n <= 0) return absl::InvalidArgumentError("a sequence in the batch has no new tokens");
    if (in.start_pos + in.n > c.max_context || (rope_ && in.start_pos + in.n > rope_->max_pos()))
      return absl::InvalidArgumentError(absl::StrCat("position ", in.start_pos + in.n - 1,
                                                     " is past the context length ",
                                                     c.max_context));
    if (rope_) rope_->Reserve(in.start_pos + in.n);  // before the threads read it
    if (rope_swa_) rope_swa_->Reserve(in.start_pos + in.n);
    const int64_t need = (in.start_pos + in.n + kv->config().page_size - 1) / kv->config().page_size;
    if (in.pages == nullptr || static_cast<int64_t>(in.pages->size()) < need)
      return absl::InternalError("page table does not cover the new tokens");
    for (int i = 0; i < in.n; ++i)
      if (in.tokens[i] < 0 || in.tokens[i] >= c.vocab_size)
        return absl::InvalidArgumentError(absl::StrCat("token id ", in.tokens[i],
                                                       " is out of range [0, ", c.vocab_size, ")"));
    if (in.lora < 0 || in.lora > num_loras() || (in.lora > 0 && loras_[in.lora - 1].empty()))
      return absl::InvalidArgumentError(absl::StrCat(
          "LoRA adapter id ", in.lora, " is out of range [0, ", num_loras(), "] or unloaded"));
    any_lora |= in.lora != 0;
    row0[s + 1] = row0[s] + in.n;
  }
  const int T = row0.back();
  std::vector<int> seq_of_row(T);
  for (size_t s = 0; s < batch.size(); ++s)
    std::fill(seq_of_row.begin() + row0[s], seq_of_row.begin() + row0[s + 1], static_cast<int>(s));
  x_.resize(static_cast<size_t>(T) * D);
  xn_.resize(x_.size());
  q_.resize(static_cast<size_t>(T) * qdim);
  k_.resize(static_cast<size_t>(T) * kdim);
  v_.resize(static_cast<size_t>(T) * kdim);
  att_.resize(q_.size());
  proj_.resize(x_.size());
  gate_.resize(static_cast<size_t>(T) * ffn_local_);
  up_.resize(gate_.size());

  // Embeddings (+ learned positions for GPT-2).
  std::vector<float> pos_row(D);
  for (size_t s = 0; s < batch.size(); ++s)
    for (int i = 0; i < batch[s].n; ++i) {
      float* xr = &x_[static_cast<size_t>(row0[s] + i) * D];
      MatrixRowToFloat(token_embd_, batch[s].tokens[i], xr);
      if (c.embed_scale != 1.0f)
        for (int d = 0; d < D; ++d) xr[d] *= c.embed_scale;
      if (c.arch == Arch::kGpt2) {
        MatrixRowToFloat(position_embd_, batch[s].start_pos + i, pos_row.data());
        AddInPlace(xr, pos_row.data(), D);
      }
    }

  ThreadPool* pool = options_.pool;
  const LoraExpandFn lora_expand = any_lora ? PickLoraExpand() : nullptr;
  // y = x·Wᵀ for every row, then each run of consecutive sequences with the same adapter adds
  // its update (x·Aᵀ)·Bᵀ on its rows (B carries the scale), as r vector updates per row.
  auto matmul = [&](const Matrix& w, const float* in, float* out,
                    LoraDelta LoraLayer::*update = nullptr, int layer = 0) {
    Stopwatch sw;
    MatMul(w, in, T, out, pool);
    if (any_lora && update != nullptr) {
      for (size_t s0 = 0, s1; s0 < batch.size(); s0 = s1) {
        s1 = s0 + 1;
        while (s1 < batch.size() && batch[s1].lora == batch[s0].lora) ++s1;
        if (batch[s0].lora == 0) continue;
        const LoraDelta& d = loras_[batch[s0].lora - 1][layer].*update;
        if (d.a.rows == 0) continue;
        const int64_t t0 = row0[s0], n = row0[s1] - row0[s0], r = d.a.rows, n_out = w.rows;
        lora_r_.resize(static_cast<size_t>(n * r));
        MatMul(d.a, in + t0 * w.cols, n, lora_r_.data(), pool);
        auto expand = [&](int64_t i0, int64_t i1, int) {
          for (int64_t i = i0; i < i1; ++i)
            lora_expand(&lora_r_[i * r], r, d.bt.data(), n_out, out + (t0 + i) * n_out);
        };
        if (pool != nullptr && pool->num_threads() > 1 && n >= 16) {
          pool->ParallelFor(n, expand);
        } else {
          expand(0, n, 0);
        }
      }
    }
    timings_.matmul += sw.Seconds();
  };
  // Row-wise work (norms, RoPE, SwiGLU, residual adds) on the pool's threads for prefill-sized
  // batches; each row is computed the same way whatever the split. A decode step's few rows
  // stay on the caller (dispatch would cost more than the work).
  constexpr int kRowsPerTask = 8;
  auto by_rows = [&](const std::function<void(int, int)>& fn) {
    if (pool == nullptr || pool->num_threads() <= 1 || T < 2 * kRowsPerTask) return fn(0, T);
    pool->ParallelFor(
        T, [&](int64_t b, int64_t e, int) { fn(static_cast<int>(b), static_cast<int>(e)); },
        kRowsPerTask);
  };
  auto norm_rows = [&](const std::vector<float>& w, const std::vector<float>& b) {
    by_rows([&](int t0, int t1) {
      for (int t = t0; t < t1; ++t)
        Norm(&x_[static_cast<size_t>(t) * D], w, b, &xn_[static_cast<size_t>(t) * D]);
    });
  };
  // Gemma's post-norms: rows of proj_ RMS-normalized in place before the residual add.
  auto post_norm_rows = [&](const std::vector<float>& w) {
    if (w.empty()) return;
    by_rows([&](int t0, int t1) {
      for (int t = t0; t < t1; ++t) {
        float* y = &proj_[static_cast<size_t>(t) * D];
        RmsNorm(y, w.data(), D, c.norm_eps, y);
      }
    });
  };
  auto add_rows = [&](float* y, const float* x, int64_t n) {
    by_rows([&](int t0, int t1) {
      AddInPlace(y + t0 * n, x + t0 * n, static_cast<int>((t1 - t0) * n));
    });
  };

  for (int l = 0; l < c.n_layers; ++l) {
    Layer& L = layers_[l];
    norm_rows(L.attn_norm_w, L.attn_norm_b);
    matmul(L.wq, xn_.data(), q_.data(), &LoraLayer::q, l);
    matmul(L.wk, xn_.data(), k_.data(), &LoraLayer::k, l);
    matmul(L.wv, xn_.data(), v_.data(), &LoraLayer::v, l);
    AddBias(q_.data(), L.bq, T, qdim);
    AddBias(k_.data(), L.bk, T, kdim);
    AddBias(v_.data(), L.bv, T, kdim);
    // Qwen3's per-head Q/K norms and RoPE (row-wise), then append K/V to the cache (in order:
    // rows share page boxes).
    if (rope_) {
      const bool adj = c.rope_style == RopeStyle::kAdjacent;
      const RopeTable& rope = c.SlidingLayer(l) ? *rope_swa_ : *rope_;
      auto head = [&](float* x, const std::vector<float>& norm, int64_t pos) {
        if (!norm.empty()) RmsNorm(x, norm.data(), hd, c.norm_eps, x);
        rope.Apply(x, pos, adj);
      };
      by_rows([&](int t0, int t1) {
        for (int t = t0; t < t1; ++t) {
          const int64_t pos = batch[seq_of_row[t]].start_pos + (t - row0[seq_of_row[t]]);
          for (int h = 0; h < heads_local_; ++h)
            head(&q_[static_cast<size_t>(t) * qdim + h * hd], L.q_norm, pos);
          for (int h = 0; h < kv_local_; ++h)
            head(&k_[static_cast<size_t>(t) * kdim + h * hd], L.k_norm, pos);
        }
      });
    }
    for (size_t s = 0; s < batch.size(); ++s) {
      const SeqInput& in = batch[s];
      for (int i = 0; i < in.n; ++i) {
        const int t = row0[s] + i;
        const int64_t pos = in.start_pos + i;
        const int ps = kv->config().page_size;
        kv->WriteToken(l, (*in.pages)[pos / ps], static_cast<int>(pos % ps),
                       &k_[static_cast<size_t>(t) * kdim], &v_[static_cast<size_t>(t) * kdim]);
      }
    }
    Stopwatch sw;
    Attention(l, batch, row0, seq_of_row, kv);
    timings_.attention += sw.Seconds();
    matmul(L.wo, att_.data(), proj_.data(), &LoraLayer::o, l);
    AddBias(proj_.data(), L.bo, T, D);
    TS_RETURN_IF_ERROR(AllReduce(proj_.data(), proj_.size()));
    post_norm_rows(L.post_attn_norm);
    add_rows(x_.data(), proj_.data(), D);

    norm_rows(L.ffn_norm_w, L.ffn_norm_b);
    if (c.arch == Arch::kGpt2) {
      matmul(L.w_up, xn_.data(), up_.data(), &LoraLayer::up, l);
      AddBias(up_.data(), L.b_up, T, ffn_local_);
      GeluNew(up_.data(), T * ffn_local_);
      matmul(L.w_down, up_.data(), proj_.data(), &LoraLayer::down, l);
    } else {
      matmul(L.w_gate, xn_.data(), gate_.data(), &LoraLayer::gate, l);
      matmul(L.w_up, xn_.data(), up_.data(), &LoraLayer::up, l);
      by_rows([&](int t0, int t1) {
        // Row by row, so that a row's vector/tail split does not depend on the thread split.
        const size_t f = static_cast<size_t>(ffn_local_);
        for (int t = t0; t < t1; ++t) {
          if (c.gelu_gate) {
            GeGlu(&gate_[t * f], &up_[t * f], ffn_local_);
          } else {
            SwiGlu(&gate_[t * f], &up_[t * f], ffn_local_);
          }
        }
      });
      matmul(L.w_down, gate_.data(), proj_.data(), &LoraLayer::down, l);
    }
    AddBias(proj_.data(), L.b_down, T, D);
    TS_RETURN_IF_ERROR(AllReduce(proj_.data(), proj_.size()));
    post_norm_rows(L.post_ffn_norm);
    add_rows(x_.data(), proj_.data(), D);
  }

  // Final norm and LM head on the rows that need logits.
  std::vector<int> rows;
  for (size_t s = 0; s < batch.size(); ++s) {
    if (batch[s].all_logits) {
      for (int i = 0; i < batch[s].n; ++i) rows.push_back(row0[s] + i);
    } else {
      rows.push_back(row0[s + 1] - 1);
    }
  }
  hidden_.resize(rows.size() * D);
  for (size_t r = 0; r < rows.size(); ++r)
    Norm(&x_[static_cast<size_t>(rows[r]) * D], output_norm_w_, output_norm_b_, &hidden_[r * D]);
  for (size_t s = 0; s < batch.size(); ++s) {
    float* pooled = batch[s].pooled;
    if (pooled == nullptr || batch[s].pooling == Pooling::kNone) continue;
    const int first = batch[s].pooling == Pooling::kLast ? row0[s + 1] - 1 : row0[s];
    if (batch[s].pooling == Pooling::kLast) std::fill(pooled, pooled + D, 0.0f);
    std::vector<float> h(D);
    for (int t = first; t < row0[s + 1]; ++t) {
      Norm(&x_[static_cast<size_t>(t) * D], output_norm_w_, output_norm_b_, h.data());
      for (int64_t d = 0; d < D; ++d) pooled[d] += h[d];
    }
  }
  logits->resize(rows.size() * static_cast<size_t>(c.vocab_size));
  {
    Stopwatch sw;
    MatMul(output_, hidden_.data(), static_cast<int64_t>(rows.size()), logits->data(), pool);
    timings_.matmul += sw.Seconds();
  }
  timings_.other = total.Seconds() - timings_.matmul - timings_.attention;
  return absl::OkStatus();
}

namespace {

// Flash-decoding's merge of one query group's attention over parts of its tokens: out = sum_i
// exp(lse_i - max) out_i / sum_i exp(lse_i - max), per head. Part i's [group][hd] output is at
// part_out + i * out_stride, its [group] log-sum-exp at part_lse + i * lse_stride; a part with
// no tokens (lse -inf) adds exact zeros.
void MergeParts(const float* part_out, const float* part_lse, int n_parts, size_t out_stride,
                size_t lse_stride, int group, int hd, float* out) {
  for (int g = 0; g < group; ++g) {
    float m = -std::numeric_limits<float>::infinity();
    for (int i = 0; i < n_parts; ++i) m = std::max(m, part_lse[i * lse_stride + g]);
    float* o = out + static_cast<size_t>(g) * hd;
    std::fill(o, o + hd, 0.0f);
    if (m == -std::numeric_limits<float>::infinity()) continue;
    float wsum = 0;
    for (int i = 0; i < n_parts; ++i) {
      const float w = std::exp(part_lse[i * lse_stride + g] - m);
      wsum += w;
      const float* po = part_out + i * out_stride + static_cast<size_t>(g) * hd;
      for (int x = 0; x < hd; ++x) o[x] += w * po[x];
    }
    for (int x = 0; x < hd; ++x) o[x] /= wsum;
  }
}

}  // namespace

void TransformerRunner::Attention(int layer, const std::vector<SeqInput>& batch,
                                  const std::vector<int>& row0, const std::vector<int>& seq_of_row,
                                  PagedKvCache* kv) {
  const int hd = config_.head_dim, ps = kv->config().page_size;
  const int qdim = heads_local_ * hd;
  const int group = heads_local_ / kv_local_;  // local query heads per local KV head
  const float scale = config_.AttentionScale();
  // A sliding layer's row at position p attends [p - window + 1, p] only; its rows are all
  // items of the body below (dense over the window, no selection), each reading at most
  // window tokens.
  const int64_t window = config_.SlidingLayer(layer) ? config_.sliding_window : 0;
  // Work items: (row t, local KV head).
  const int T = row0.back();
  const int64_t items = static_cast<int64_t>(T) * kv_local_;
  auto q_of = [&](int64_t it) {
    return &q_[static_cast<size_t>(it / kv_local_) * qdim +
               static_cast<size_t>(it % kv_local_) * group * hd];
  };
  auto out_of = [&](int64_t it) {
    return &att_[static_cast<size_t>(it / kv_local_) * qdim +
                 static_cast<size_t>(it % kv_local_) * group * hd];
  };
  auto page_spans = [&](int64_t it, const int32_t* lps, size_t n, std::vector<KvSpan>* spans) {
    const SeqInput& in = batch[seq_of_row[it / kv_local_]];
    const int64_t n_tok = in.start_pos + (it / kv_local_ - row0[seq_of_row[it / kv_local_]]) + 1;
    const int64_t lo = window > 0 ? std::max<int64_t>(0, n_tok - window) : 0;
    spans->clear();
    for (size_t i = 0; i < n; ++i) {
      const int64_t first = int64_t{lps[i]} * ps;
      const int n_in = static_cast<int>(std::min<int64_t>(ps, n_tok - first));
      KvSpan sp = PageSpan(*kv, layer, (*in.pages)[lps[i]], static_cast<int>(it % kv_local_), n_in);
      if (lo > first) sp = SkipTokens(sp, static_cast<int>(lo - first), hd);
      spans->push_back(sp);
    }
  };
  // Decode items with more than kPartPages pages to attend are split into parts of kPartPages
  // pages, attended in a second parallel pass and merged by their log-sum-exp (as
  // flash-decoding does): a long-context decode step has only batch x KV heads items, too few
  // to keep the threads busy (prefill chunks have rows x KV heads, enough). The split depends
  // on the page count alone, so a row's result does not depend on the batch it runs in or the
  // thread count.
  const size_t kPartPages = static_cast<size_t>(std::max(1, options_.attention_part_pages));
  // Prefill rows (a sequence with more than one new row; always dense) go in blocks of
  // kPrefillBlockRows consecutive rows per KV head: AttendCausalBlock reads the prefix once per
  // block instead of once per row. A row's result does not depend on the block it falls in.
  struct PrefillBlock {
    int t0, n_rows, h;
  };
  constexpr int kPrefillBlockRows = 32;
  std::vector<PrefillBlock> blocks;
  std::vector<char> in_block(T, 0);
  // Verified rows (SeqInput::decode_rows): one item per (sequence, KV head) for all its rows.
  // On a layer where the sequence selects, each row is a decode item of its own instead (body),
  // selecting and attending as its decode step would.
  std::vector<std::pair<int, int>> verify;
  for (size_t s = 0; s + 1 < row0.size() && window == 0; ++s) {
    if (!batch[s].decode_rows || batch[s].n <= 1) continue;
    if (batch[s].selector != nullptr && batch[s].selector->Active(layer)) continue;
    for (int h = 0; h < kv_local_; ++h) verify.emplace_back(static_cast<int>(s), h);
    std::fill(in_block.begin() + row0[s], in_block.begin() + row0[s + 1], 1);
  }
  if (hd % 32 == 0 && hd <= 256 && window == 0) {
    for (size_t s = 0; s + 1 < row0.size(); ++s) {
      if (batch[s].n <= 1 || batch[s].decode_rows) continue;
      for (int t = row0[s]; t < row0[s + 1]; t += kPrefillBlockRows)
        for (int h = 0; h < kv_local_; ++h)
          blocks.push_back({t, std::min(kPrefillBlockRows, row0[s + 1] - t), h});
      std::fill(in_block.begin() + row0[s], in_block.begin() + row0[s + 1], 1);
    }
  }
  std::vector<std::vector<int32_t>> pending(items);  // chosen pages of the split items
  auto body = [&](int64_t b, int64_t e, int) {
    std::vector<KvSpan> spans;
    std::vector<int32_t> chosen;
    std::vector<float> scores, lse(group);
    for (int64_t it = b; it < e; ++it) {
      const int t = static_cast<int>(it / kv_local_), h = static_cast<int>(it % kv_local_);
      if (in_block[t]) continue;
      const SeqInput& in = batch[seq_of_row[t]];
      const int64_t pos = in.start_pos + (t - row0[seq_of_row[t]]);
      const int64_t n_tok = pos + 1;  // causal: this token and everything before it
      const int64_t n_pages = (n_tok + ps - 1) / ps;
      const float* q = q_of(it);
      // Selection applies to decode (one new token, or a verified row) on active layers only;
      // prefill is dense.
      const bool decode = in.n == 1 || in.decode_rows;
      AttentionSelector* sel = decode && window == 0 ? in.selector : nullptr;
      chosen.clear();
      if (window > 0) {
        for (int64_t p = std::max<int64_t>(0, n_tok - window) / ps; p < n_pages; ++p)
          chosen.push_back(static_cast<int32_t>(p));
      } else if (sel != nullptr && sel->Active(layer)) {
        SelectArgs a;
        a.layer = layer;
        a.kv_head = h;
        a.q = q;
        a.group = group;
        a.head_dim = hd;
        a.pages = in.pages;
        a.n_tokens = n_tok;
        a.page_size = ps;
        a.kv = kv;
        a.row = in.decode_rows ? t - row0[seq_of_row[t]] : 0;
        sel->Select(a, &chosen);
      } else {
        for (int64_t p = 0; p < n_pages; ++p) chosen.push_back(static_cast<int32_t>(p));
      }
      const bool want_scores = sel != nullptr && sel->NeedsScores(layer);
      if (decode && chosen.size() > kPartPages && !want_scores) {
        pending[it] = chosen;
        continue;
      }
      page_spans(it, chosen.data(), chosen.size(), &spans);
      int64_t total = 0;
      for (const KvSpan& sp : spans) total += sp.n;
      AttendOptions opt;
      opt.scale = scale;
      if (want_scores) {
        scores.resize(static_cast<size_t>(group) * total);
        opt.scores_out = scores.data();
        opt.lse_out = lse.data();
      }
      AttendSpans(q, group, hd, spans.data(), static_cast<int>(spans.size()), opt, out_of(it));
      if (want_scores) {
        ScoresArgs sa;
        sa.layer = layer;
        sa.kv_head = h;
        sa.group = group;
        sa.chosen = &chosen;
        sa.scores = scores.data();
        sa.lse = lse.data();
        sa.n_tokens = n_tok;
        sa.page_size = ps;
        sel->OnScores(sa);
      }
    }
  };
  auto parallel = [&](int64_t n, const std::function<void(int64_t, int64_t, int)>& fn) {
    if (options_.pool != nullptr && n > 1) {
      options_.pool->ParallelFor(n, fn);
    } else {
      fn(0, n, 0);
    }
  };
  parallel(items, body);
  if (!blocks.empty()) {
    parallel(static_cast<int64_t>(blocks.size()), [&](int64_t b, int64_t e, int) {
      std::vector<KvSpan> spans;
      std::vector<int32_t> all;
      for (int64_t i = b; i < e; ++i) {
        const PrefillBlock& pb = blocks[i];
        const int s = seq_of_row[pb.t0];
        const int64_t pos0 = batch[s].start_pos + (pb.t0 - row0[s]);
        const int64_t n_pages = (pos0 + pb.n_rows + ps - 1) / ps;
        all.resize(static_cast<size_t>(n_pages));
        for (int64_t p = 0; p < n_pages; ++p) all[p] = static_cast<int32_t>(p);
        // The spans of the block's last row: every token any row of the block attends.
        page_spans(int64_t{pb.t0 + pb.n_rows - 1} * kv_local_ + pb.h, all.data(), all.size(),
                   &spans);
        const int64_t first = int64_t{pb.t0} * kv_local_ + pb.h;
        AttendCausalBlock(q_of(first), qdim, pb.n_rows, group, hd, pos0, spans.data(),
                          static_cast<int>(spans.size()), scale, out_of(first), qdim);
      }
    });
  }

  if (!verify.empty()) {
    parallel(static_cast<int64_t>(verify.size()), [&](int64_t b, int64_t e, int) {
      std::vector<KvSpan> spans;
      std::vector<int32_t> all;
      std::vector<int64_t> limit;
      std::vector<float> part_out, part_lse;
      for (int64_t i = b; i < e; ++i) {
        const auto [s, h] = verify[i];
        const SeqInput& in = batch[s];
        const int rows = in.n, t0 = row0[s];
        const int64_t first = int64_t{t0} * kv_local_ + h;
        auto n_pages_of = [&](int r) { return (in.start_pos + r + 1 + ps - 1) / ps; };
        // Rows whose pages fit one part attend in one call, as their decode steps would; the
        // rest (more than kPartPages pages) part by part, merged as the decode path merges.
        int whole = 0;
        while (whole < rows && static_cast<size_t>(n_pages_of(whole)) <= kPartPages) ++whole;
        if (whole > 0) {
          all.resize(static_cast<size_t>(n_pages_of(whole - 1)));
          for (size_t p = 0; p < all.size(); ++p) all[p] = static_cast<int32_t>(p);
          page_spans((first + int64_t{whole - 1} * kv_local_), all.data(), all.size(), &spans);
          limit.resize(whole);
          for (int r = 0; r < whole; ++r) limit[r] = in.start_pos + r + 1;
          AttendSpansRows(q_of(first), qdim, whole, group, hd, spans.data(),
                          static_cast<int>(spans.size()), limit.data(), scale, out_of(first), qdim);
        }
        const int split = rows - whole;
        if (split == 0) continue;
        const int64_t last = first + int64_t{rows - 1} * kv_local_;
        const int64_t n_pages = n_pages_of(rows - 1);
        const int64_t n_parts = (n_pages + kPartPages - 1) / kPartPages;
        const size_t elems = static_cast<size_t>(group) * hd;
        part_out.resize(static_cast<size_t>(n_parts) * split * elems);
        part_lse.resize(static_cast<size_t>(n_parts) * split * group);
        limit.resize(split);
        for (int64_t m = 0; m < n_parts; ++m) {
          const int64_t p0 = m * static_cast<int64_t>(kPartPages);
          all.resize(static_cast<size_t>(std::min<int64_t>(kPartPages, n_pages - p0)));
          for (size_t p = 0; p < all.size(); ++p) all[p] = static_cast<int32_t>(p0 + p);
          page_spans(last, all.data(), all.size(), &spans);
          for (int r = 0; r < split; ++r)
            limit[r] = std::max<int64_t>(0, in.start_pos + whole + r + 1 - p0 * ps);
          AttendSpansRows(q_of(first + int64_t{whole} * kv_local_), qdim, split, group, hd,
                          spans.data(), static_cast<int>(spans.size()), limit.data(), scale,
                          &part_out[m * split * elems], static_cast<int64_t>(elems),
                          &part_lse[m * split * group]);
        }
        for (int r = 0; r < split; ++r)
          MergeParts(&part_out[r * elems], &part_lse[r * group], static_cast<int>(n_parts),
                     split * elems, split * group, group, hd,
                     out_of(first + int64_t{whole + r} * kv_local_));
      }
    });
  }

  // The split items: parts (item, first chosen index), attended with their log-sum-exp.
  std::vector<std::pair<int64_t, size_t>> parts;
  for (int64_t it = 0; it < items; ++it)
    for (size_t p0 = 0; p0 < pending[it].size(); p0 += kPartPages) parts.emplace_back(it, p0);
  if (parts.empty()) return;
  const size_t part_elems = static_cast<size_t>(group) * hd;
  std::vector<float> part_out(parts.size() * part_elems), part_lse(parts.size() * group);
  parallel(static_cast<int64_t>(parts.size()), [&](int64_t b, int64_t e, int) {
    std::vector<KvSpan> spans;
    for (int64_t i = b; i < e; ++i) {
      const auto [it, p0] = parts[i];
      const std::vector<int32_t>& ch = pending[it];
      page_spans(it, ch.data() + p0, std::min(kPartPages, ch.size() - p0), &spans);
      AttendOptions opt;
      opt.scale = scale;
      opt.lse_out = &part_lse[i * group];
      AttendSpans(q_of(it), group, hd, spans.data(), static_cast<int>(spans.size()), opt,
                  &part_out[i * part_elems]);
    }
  });
  for (size_t i0 = 0; i0 < parts.size();) {
    const int64_t it = parts[i0].first;
    size_t i1 = i0;
    while (i1 < parts.size() && parts[i1].first == it) ++i1;
    MergeParts(&part_out[i0 * part_elems], &part_lse[i0 * group], static_cast<int>(i1 - i0),
               part_elems, group, group, hd, out_of(it));
    i0 = i1;
  }
}

}  // namespace tinyserve
