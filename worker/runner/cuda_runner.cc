#include "worker/runner/cuda_runner.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cpu/dequant.h"
#include "worker/model/weight_source.h"

namespace tinyserve {

absl::StatusOr<int> CudaRunner::AddLora(const LoraAdapter& adapter) {
  TS_ASSIGN_OR_RETURN(PreparedLora lora, PrepareLora(adapter));
  return InstallLora(lora);
}

absl::Status ValidateCudaSelection(const SelectionSpec& spec) {
  if (spec.policy != "dense" && spec.policy != "quest")
    return absl::InvalidArgumentError(absl::StrCat(
        "selection.policy: '", spec.policy, "' is not available with --device cuda (dense, quest)"));
  if (spec.policy == "quest" && spec.recent_pages != 0)
    return absl::InvalidArgumentError(
        "selection.recent_pages: must be 0 with --device cuda (the fused kernel keeps sinks only)");
  if (spec.oracle_every != 0)
    return absl::InvalidArgumentError(
        "selection.oracle_every: oracle sampling is CPU-only (use 0 with --device cuda)");
  return absl::OkStatus();
}

#if TINYSERVE_HAVE_CUDA_RUNNER

struct CudaRunner::Impl {
  std::unique_ptr<cuda::DeviceModel> model;
  std::vector<cuda::DeviceSeq> seqs;
  std::vector<float> hidden;  // embeddings: the pooled sequences' rows (DeviceModel::Forward)
};

CudaRunner::CudaRunner() : impl_(std::make_unique<Impl>()) {}
CudaRunner::~CudaRunner() = default;

bool CudaRunner::Available() { return true; }

namespace {

cuda::DeviceModelConfig MakeDeviceConfig(const ModelConfig& c, int page_size, int64_t num_pages,
                                         int max_context) {
  cuda::DeviceModelConfig d;
  d.n_layers = c.n_layers;
  d.dim = c.dim;
  d.n_heads = c.n_heads;
  d.n_kv_heads = c.n_kv_heads;
  d.head_dim = c.head_dim;
  d.ffn_dim = c.ffn_dim;
  d.vocab = c.vocab_size;
  d.norm_eps = c.norm_eps;
  d.rope_theta = c.rope_theta;
  d.rope_adjacent = c.rope_style == RopeStyle::kAdjacent;
  d.rope_freq_scale = c.rope_freq_scale;
  d.rope_freq_factors = c.rope_freq_factors;
  d.rope_attn_factor = c.rope_attn_factor;
  d.page_size = page_size;
  d.num_pages = static_cast<int>(num_pages);
  d.max_pages_per_seq = (max_context + page_size - 1) / page_size;
  return d;
}

}  // namespace

int64_t CudaRunner::KvBytesPerPage(const ModelConfig& config, int page_size) {
  return cuda::DeviceModel::KvBytesPerPage(MakeDeviceConfig(config, page_size, 1, page_size));
}

absl::StatusOr<std::unique_ptr<CudaRunner>> CudaRunner::Create(const WeightSource& source,
                                                               const CudaRunnerOptions& o) {
  const ModelConfig& c = source.config();
  if (c.arch != Arch::kLlama)
    return absl::UnimplementedError(
        absl::StrCat("--device cuda runs Llama-family models; ", ArchName(c), " is CPU-only"));
  if (c.post_norms || c.gelu_gate || c.sliding_window > 0 || c.embed_scale != 1.0f)
    return absl::UnimplementedError(
        absl::StrCat("--device cuda: ", ArchName(c),
                     " (post-norms, GeGLU, sliding-window attention) is CPU-only"));
  if (source.Has("blk.0.attn_output.bias"))
    return absl::UnimplementedError(
        "--device cuda: an output projection bias (blk.0.attn_output.bias) is not supported");
  if (o.num_pages <= 0 || o.num_pages > (int64_t{1} << 30))
    return absl::InvalidArgumentError(absl::StrCat("kv pages must be in [1, 2^30], got ", o.num_pages));
  std::unique_ptr<CudaRunner> r(new CudaRunner());
  r->config_ = c;
  const int max_context = o.max_context > 0 ? std::min(o.max_context, c.max_context) : c.max_context;
  cuda::DeviceModelConfig d = MakeDeviceConfig(c, o.page_size, o.num_pages, max_context);
  d.qkv_bias = source.Has("blk.0.attn_q.bias");
  d.qk_norm = c.qk_norm;
  d.max_batch = o.max_batch;
  d.max_tokens = std::max(o.max_tokens, o.max_batch);
  d.device_pages = o.device_pages;
  d.resident_layers = o.resident_layers;
  d.cuda_graphs = o.cuda_graphs;
  d.device = o.device;
  std::string err;
  r->impl_->model = cuda::DeviceModel::Create(d, &err);
  if (r->impl_->model == nullptr)
    return absl::FailedPreconditionError(absl::StrCat("--device cuda: ", err));

  // Weights: dequantized on the host, row by row, then uploaded (converted to f16).
  std::vector<float> buf;
  auto upload = [&](cuda::WeightSlot slot, int layer, const std::string& name,
                    int64_t rows, int64_t cols) -> absl::Status {
    TS_ASSIGN_OR_RETURN(TensorRef t, source.Get(name));
    int64_t count = 1;
    for (int64_t e : t.ne) count *= e;
    if (count != rows * cols || (t.ne.size() == 2 && t.ne[0] != cols))
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': expected ", rows, " x ",
                                                     cols, " elements, got ", count));
    buf.resize(static_cast<size_t>(count));
    const size_t row_bytes = GgmlRowBytes(t.type, cols);
    for (int64_t i = 0; i < rows; ++i)
      TS_RETURN_IF_ERROR(DequantizeRow(t.type, t.data + i * row_bytes, &buf[i * cols], cols));
    std::string e;
    if (!r->impl_->model->SetWeight(slot, layer, buf.data(), count, &e))
      return absl::InternalError(absl::StrCat("uploading '", name, "': ", e));
    source.DropPages(t.data, t.nbytes);  // on the device now
    return absl::OkStatus();
  };
  using S = cuda::WeightSlot;
  const int64_t D = c.dim, qd = int64_t{c.n_heads} * c.head_dim,
                kd = int64_t{c.n_kv_heads} * c.head_dim, F = c.ffn_dim;
  TS_RETURN_IF_ERROR(upload(S::kEmbedding, 0, "token_embd.weight", c.vocab_size, D));
  TS_RETURN_IF_ERROR(upload(S::kOutputNorm, 0, "output_norm.weight", 1, D));
  const bool untied = !c.tied_embeddings && source.Has("output.weight");
  TS_RETURN_IF_ERROR(upload(S::kLmHead, 0, untied ? "output.weight" : "token_embd.weight",
                            c.vocab_size, D));
  for (int l = 0; l < c.n_layers; ++l) {
    auto blk = [&](const char* w) { return absl::StrCat("blk.", l, ".", w); };
    TS_RETURN_IF_ERROR(upload(S::kAttnNorm, l, blk("attn_norm.weight"), 1, D));
    TS_RETURN_IF_ERROR(upload(S::kWq, l, blk("attn_q.weight"), qd, D));
    TS_RETURN_IF_ERROR(upload(S::kWk, l, blk("attn_k.weight"), kd, D));
    TS_RETURN_IF_ERROR(upload(S::kWv, l, blk("attn_v.weight"), kd, D));
    if (d.qkv_bias) {  // all three, as llama.cpp's qwen2 requires
      TS_RETURN_IF_ERROR(upload(S::kBq, l, blk("attn_q.bias"), 1, qd));
      TS_RETURN_IF_ERROR(upload(S::kBk, l, blk("attn_k.bias"), 1, kd));
      TS_RETURN_IF_ERROR(upload(S::kBv, l, blk("attn_v.bias"), 1, kd));
    }
    if (d.qk_norm) {
      TS_RETURN_IF_ERROR(upload(S::kQNorm, l, blk("attn_q_norm.weight"), 1, c.head_dim));
      TS_RETURN_IF_ERROR(upload(S::kKNorm, l, blk("attn_k_norm.weight"), 1, c.head_dim));
    }
    TS_RETURN_IF_ERROR(upload(S::kWo, l, blk("attn_output.weight"), D, qd));
    TS_RETURN_IF_ERROR(upload(S::kFfnNorm, l, blk("ffn_norm.weight"), 1, D));
    TS_RETURN_IF_ERROR(upload(S::kWgate, l, blk("ffn_gate.weight"), F, D));
    TS_RETURN_IF_ERROR(upload(S::kWup, l, blk("ffn_up.weight"), F, D));
    TS_RETURN_IF_ERROR(upload(S::kWdown, l, blk("ffn_down.weight"), D, F));
  }
  return r;
}

absl::Status CudaRunner::Forward(const std::vector<SeqInput>& batch,
                                 const std::vector<const SelectionSpec*>& selection,
                                 std::vector<float>* logits) {
  std::vector<cuda::DeviceSeq>& seqs = impl_->seqs;
  seqs.resize(batch.size());
  const int ps = impl_->model->config().page_size;
  bool any_hidden = false;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SeqInput& in = batch[i];
    if (in.pages == nullptr) return absl::InternalError("sequence without a page table");
    cuda::DeviceSeq& d = seqs[i];
    d.tokens = in.tokens;
    d.n = in.n;
    d.start_pos = in.start_pos;
    d.pages = in.pages->data();
    d.n_pages = static_cast<int>(in.pages->size());
    d.all_logits = in.all_logits;
    d.hidden = in.pooling != Pooling::kNone && in.pooled != nullptr;
    d.hidden_last = in.pooling == Pooling::kLast;
    d.lora = in.lora;
    any_hidden = any_hidden || d.hidden;
    d.attention = cuda::DeviceAttention();
    const SelectionSpec* s = i < selection.size() ? selection[i] : nullptr;
    if (s != nullptr && s->policy == "quest") {
      d.attention.quest = true;
      d.attention.budget_pages = std::max(1, s->budget / ps);
      d.attention.sink_pages = s->sink_pages;
      d.attention.dense_layers = s->dense_layers;
      auto it = s->params.find("gqa");
      d.attention.gqa_max = it != s->params.end() && it->second == "max";
    }
  }
  std::string err;
  if (!impl_->model->Forward(seqs, logits, &err, any_hidden ? &impl_->hidden : nullptr)) {
    // Bad shapes were checked by the engine; what is left is a device failure.
    return absl::InternalError(absl::StrCat("cuda forward: ", err));
  }
  if (any_hidden) {  // as TransformerRunner pools: the last row, or add the rows' sum
    const size_t D = static_cast<size_t>(impl_->model->config().dim);
    const float* row = impl_->hidden.data();
    for (size_t i = 0; i < batch.size(); ++i) {
      if (!seqs[i].hidden) continue;
      float* pooled = batch[i].pooled;
      for (size_t d = 0; d < D; ++d) pooled[d] = (seqs[i].hidden_last ? 0.f : pooled[d]) + row[d];
      row += D;
    }
  }
  const cuda::DeviceStepStats& st = impl_->model->last_stats();
  totals_.steps++;
  totals_.graph_steps += st.graph_replayed ? 1 : 0;
  totals_.pages_attended += st.pages_attended;
  totals_.pages_total += st.pages_total;
  totals_.tier_hits += st.tier_hits;
  totals_.tier_misses += st.tier_misses;
  totals_.bytes_moved += st.bytes_moved;
  totals_.bytes_direct += st.bytes_direct;
  return absl::OkStatus();
}

absl::StatusOr<CudaRunner::PreparedLora> CudaRunner::PrepareLora(const LoraAdapter& adapter) const {
  const ModelConfig& c = config_;
  const int64_t D = c.dim, qd = int64_t{c.n_heads} * c.head_dim,
                kd = int64_t{c.n_kv_heads} * c.head_dim, F = c.ffn_dim;
  // A fused product's update from its parts (base weight names and output rows): the parts' A
  // rows stacked, each B in its rows and A columns (scale folded in). LoraAdapter::Open checked
  // the shapes against the model.
  struct Part {
    std::string weight;
    int64_t rows;
  };
  auto product = [&](int64_t in,
                     const std::vector<Part>& parts) -> absl::StatusOr<cuda::DeviceLoraUpdate> {
    cuda::DeviceLoraUpdate u;
    int64_t out = 0;
    for (const Part& p : parts) {
      if (const LoraPair* pair = adapter.Find(p.weight)) u.rank += pair->rank();
      out += p.rows;
    }
    u.a.reserve(static_cast<size_t>(u.rank * in));
    u.b.assign(static_cast<size_t>(out * u.rank), 0.f);
    int64_t r0 = 0, o0 = 0;
    for (const Part& p : parts) {
      if (const LoraPair* pair = adapter.Find(p.weight)) {
        const int64_t r = pair->rank();
        TS_ASSIGN_OR_RETURN(std::vector<float> a, TensorBlock(pair->a, 0, r, 0, in));
        TS_ASSIGN_OR_RETURN(std::vector<float> b, TensorBlock(pair->b, 0, p.rows, 0, r));
        u.a.insert(u.a.end(), a.begin(), a.end());
        for (int64_t o = 0; o < p.rows; ++o)
          for (int64_t j = 0; j < r; ++j)
            u.b[(o0 + o) * u.rank + r0 + j] = pair->scale * b[o * r + j];
        r0 += r;
      }
      o0 += p.rows;
    }
    return u;
  };
  PreparedLora layers(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    auto blk = [&](const char* w) { return absl::StrCat("blk.", l, ".", w); };
    cuda::DeviceLoraLayer& L = layers[l];
    TS_ASSIGN_OR_RETURN(L.qkv, product(D, {{blk("attn_q.weight"), qd},
                                           {blk("attn_k.weight"), kd},
                                           {blk("attn_v.weight"), kd}}));
    TS_ASSIGN_OR_RETURN(L.o, product(qd, {{blk("attn_output.weight"), D}}));
    TS_ASSIGN_OR_RETURN(L.gate_up,
                        product(D, {{blk("ffn_gate.weight"), F}, {blk("ffn_up.weight"), F}}));
    TS_ASSIGN_OR_RETURN(L.down, product(F, {{blk("ffn_down.weight"), D}}));
  }
  return layers;
}

absl::StatusOr<int> CudaRunner::InstallLora(const PreparedLora& lora) {
  std::string err;
  const int id = impl_->model->AddLora(lora, &err);
  if (id == 0) return absl::ResourceExhaustedError(absl::StrCat("--device cuda: LoRA: ", err));
  return id;
}

void CudaRunner::RemoveLora(int id) { impl_->model->RemoveLora(id); }

bool CudaRunner::StepStatsOf(size_t i, StepStats* out) const {
  const auto& seqs = impl_->model->last_stats().seqs;
  if (i >= seqs.size() || !seqs[i].decode) return false;
  const cuda::DeviceSeqStats& d = seqs[i];
  *out = StepStats();
  out->pages_scored = d.pages_scored;
  out->pages_selected = d.pages_selected;
  out->pages_total = d.pages_total;
  out->kv_bytes_read = d.kv_bytes_read;
  out->kv_bytes_dense = d.kv_bytes_dense;
  return true;
}

#else  // !TINYSERVE_HAVE_CUDA_RUNNER

struct CudaRunner::Impl {};
CudaRunner::CudaRunner() = default;
CudaRunner::~CudaRunner() = default;
bool CudaRunner::Available() { return false; }
int64_t CudaRunner::KvBytesPerPage(const ModelConfig&, int) { return 0; }

absl::StatusOr<std::unique_ptr<CudaRunner>> CudaRunner::Create(const WeightSource&,
                                                               const CudaRunnerOptions&) {
  return absl::FailedPreconditionError(
      "--device cuda: this build has no CUDA runner (configure with nvcc and cuBLAS present)");
}

absl::Status CudaRunner::Forward(const std::vector<SeqInput>&,
                                 const std::vector<const SelectionSpec*>&, std::vector<float>*) {
  return absl::FailedPreconditionError("no CUDA backend");
}

bool CudaRunner::StepStatsOf(size_t, StepStats*) const { return false; }

absl::StatusOr<CudaRunner::PreparedLora> CudaRunner::PrepareLora(const LoraAdapter&) const {
  return absl::FailedPreconditionError("no CUDA backend");
}
absl::StatusOr<int> CudaRunner::InstallLora(const PreparedLora&) {
  return absl::FailedPreconditionError("no CUDA backend");
}
void CudaRunner::RemoveLora(int) {}

#endif

}  // namespace tinyserve
