// The Hugging Face WeightSource (OpenHfWeightSource, declared in worker/model/weight_source.h):
// a folder with config.json (worker/hf/hf_config.h), model.safetensors or a sharded
// model.safetensors.index.json (worker/hf/safetensors.h) and tokenizer.json.
//
// Tensors are renamed to the GGUF names (worker/hf/hf_names.h) and every one the runners read
// is checked against the config at open, so a bad folder fails here and not mid-forward:
//   - a tensor with no mapping (say a q_proj.bias this build cannot use) is InvalidArgument
//     naming it rather than silently ignored; buffers (inv_freq, attn.bias) are skipped;
//   - a missing tensor is NotFound naming the GGUF and the HF name;
//   - a shape that disagrees with the config is InvalidArgument naming both names.
// Plain tensors stay views into the mapping in their stored dtype (F32, F16, BF16); GPT-2's
// Conv1D weights ([in, out]) are transposed into owned F32 buffers (out rows of in elements).
// HF Llama Q/K rows are kept as stored: the config says RopeStyle::kRotateHalf.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fp16.h"
#include "common/status.h"
#include "worker/hf/hf_config.h"
#include "worker/hf/hf_names.h"
#include "worker/hf/safetensors.h"
#include "worker/model/weight_source.h"
#include "worker/tokenizer/hf_tokenizer_json.h"

namespace tinyserve {
namespace {

namespace fs = std::filesystem;

float LoadElement(const uint8_t* p, SafetensorsDtype d) {
  switch (d) {
    case SafetensorsDtype::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case SafetensorsDtype::kF16: {
      fp16_t h;
      std::memcpy(&h, p, 2);
      return Fp16ToFloat(h);
    }
    case SafetensorsDtype::kBF16: {
      bf16_t b;
      std::memcpy(&b, p, 2);
      return Bf16ToFloat(b);
    }
  }
  return 0.0f;
}

// GGUF-name -> expected ne, from the config (the same list the GGUF source checks).
std::map<std::string, std::vector<int64_t>> ExpectedShapes(const ModelConfig& c) {
  std::map<std::string, std::vector<int64_t>> want;
  const int64_t d = c.dim, v = c.vocab_size, f = c.ffn_dim;
  want["token_embd.weight"] = {d, v};
  want["output_norm.weight"] = {d};
  if (!c.tied_embeddings) want["output.weight"] = {d, v};
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string p = absl::StrCat("blk.", i, ".");
    if (c.arch == Arch::kLlama) {
      const int64_t q = int64_t{c.n_heads} * c.head_dim, kv = int64_t{c.n_kv_heads} * c.head_dim;
      want[p + "attn_norm.weight"] = {d};
      want[p + "attn_q.weight"] = {d, q};
      want[p + "attn_k.weight"] = {d, kv};
      want[p + "attn_v.weight"] = {d, kv};
      want[p + "attn_output.weight"] = {q, d};
      want[p + "ffn_norm.weight"] = {d};
      want[p + "ffn_gate.weight"] = {d, f};
      want[p + "ffn_up.weight"] = {d, f};
      want[p + "ffn_down.weight"] = {f, d};
      if (c.qk_norm) {
        want[p + "attn_q_norm.weight"] = {c.head_dim};
        want[p + "attn_k_norm.weight"] = {c.head_dim};
      }
      if (c.post_norms) {
        want[p + "post_attention_norm.weight"] = {d};
        want[p + "post_ffw_norm.weight"] = {d};
      }
    } else {
      want[p + "attn_norm.weight"] = {d};
      want[p + "attn_norm.bias"] = {d};
      want[p + "attn_qkv.weight"] = {d, 3 * d};
      want[p + "attn_qkv.bias"] = {3 * d};
      want[p + "attn_output.weight"] = {d, d};
      want[p + "attn_output.bias"] = {d};
      want[p + "ffn_norm.weight"] = {d};
      want[p + "ffn_norm.bias"] = {d};
      want[p + "ffn_up.weight"] = {d, f};
      want[p + "ffn_up.bias"] = {f};
      want[p + "ffn_down.weight"] = {f, d};
      want[p + "ffn_down.bias"] = {d};
    }
  }
  if (c.arch == Arch::kGpt2) {
    want["position_embd.weight"] = {d, c.max_context};
    want["output_norm.bias"] = {d};
  }
  return want;
}

// Tensors a checkpoint may have: a Llama's attention biases (Qwen2's Q/K/V; attention_bias).
std::map<std::string, std::vector<int64_t>> OptionalShapes(const ModelConfig& c) {
  std::map<std::string, std::vector<int64_t>> may;
  if (c.arch != Arch::kLlama) return may;
  const int64_t q = int64_t{c.n_heads} * c.head_dim, kv = int64_t{c.n_kv_heads} * c.head_dim;
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string p = absl::StrCat("blk.", i, ".");
    may[p + "attn_q.bias"] = {q};
    may[p + "attn_k.bias"] = {kv};
    may[p + "attn_v.bias"] = {kv};
    may[p + "attn_output.bias"] = {c.dim};
  }
  return may;
}

class HfWeightSource final : public WeightSource {
 public:
  static absl::StatusOr<std::unique_ptr<HfWeightSource>> Open(const std::string& dir) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      return absl::NotFoundError(absl::StrCat("hf: no folder '", dir, "'"));
    }
    auto src = std::unique_ptr<HfWeightSource>(new HfWeightSource());
    src->dir_ = dir;
    TS_ASSIGN_OR_RETURN(src->config_, ReadHfConfig((fs::path(dir) / "config.json").string()));
    std::string name = fs::path(dir).lexically_normal().filename().string();
    if (name.empty()) name = fs::path(dir).lexically_normal().parent_path().filename().string();
    src->config_.name = name;

    const std::string tok_path = (fs::path(dir) / "tokenizer.json").string();
    if (!fs::exists(tok_path, ec)) {
      return absl::NotFoundError(
          absl::StrCat("hf: folder '", dir, "' has no tokenizer.json ('", tok_path, "')"));
    }
    TS_ASSIGN_OR_RETURN(src->tokenizer_, TokenizerDataFromHfJson(tok_path));
    if (src->tokenizer_.tokens.size() > static_cast<size_t>(src->config_.vocab_size)) {
      return absl::InvalidArgumentError(
          absl::StrCat("hf: '", tok_path, "' has ", src->tokenizer_.tokens.size(),
                       " tokens, more than the model's vocab_size ", src->config_.vocab_size));
    }

    TS_ASSIGN_OR_RETURN(src->ckpt_, SafetensorsCheckpoint::Open(dir));
    TS_RETURN_IF_ERROR(src->MapTensors());
    return src;
  }

  const ModelConfig& config() const override { return config_; }
  const TokenizerData& tokenizer_data() const override { return tokenizer_; }

  absl::StatusOr<TensorRef> Get(const std::string& name) const override {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) {
      return absl::NotFoundError(absl::StrCat("hf: no tensor '", name, "' in ", dir_));
    }
    return it->second.ref;
  }
  bool Has(const std::string& name) const override { return tensors_.count(name) != 0; }

  std::string Describe() const override {
    return absl::StrCat("hf ", ArchName(config_), " folder '", dir_, "' (", ckpt_->files().size(),
                        " safetensors file", ckpt_->files().size() == 1 ? "" : "s", ", ",
                        tensors_.size(), " tensors)");
  }

 private:
  struct Entry {
    TensorRef ref;
    std::vector<uint8_t> owned;  // transposed or realigned copy; ref.data points here if used
  };

  HfWeightSource() = default;

  absl::Status MapTensors() {
    const ModelConfig& c = config_;
    const auto want = ExpectedShapes(c);
    const auto may = OptionalShapes(c);
    // Gemma's RMSNorms scale by 1 + w; the runners (and GGUF files) hold 1 + w.
    const bool gemma = c.variant == "gemma3";
    std::map<std::string, std::string> from;  // GGUF name -> HF name, to catch duplicates
    for (const auto& [hf_name, t] : ckpt_->tensors()) {
      const HfNameMapping m = MapHfTensorName(c.arch, c.tied_embeddings, hf_name, gemma);
      if (m.action == HfNameMapping::Action::kSkip) continue;
      const std::vector<int64_t>* shape = nullptr;
      if (m.action == HfNameMapping::Action::kMap) {
        if (auto it = want.find(m.gguf_name); it != want.end()) {
          shape = &it->second;
        } else if (auto jt = may.find(m.gguf_name); jt != may.end()) {
          shape = &jt->second;
        }
      }
      if (shape == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "hf: tensor '", hf_name, "' in ", dir_, " is not part of a ", ArchName(c),
            " model with ", c.n_layers, " layers (or this build does not support it)"));
      }
      auto [prev, inserted] = from.emplace(m.gguf_name, hf_name);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat("hf: tensors '", prev->second, "' and '",
                                                       hf_name, "' both map to '", m.gguf_name,
                                                       "'"));
      }
      // GGUF ne: the HF shape reversed; a Conv1D [in, out] becomes ne = [in, out] once its
      // out rows of in elements are laid out.
      std::vector<int64_t> ne(t->shape.rbegin(), t->shape.rend());
      if (m.transpose) {
        if (t->shape.size() != 2) {
          return absl::InvalidArgumentError(absl::StrCat("hf: tensor '", hf_name, "' has shape ",
                                                         ShapeString(t->shape),
                                                         ", expected a 2-D Conv1D weight"));
        }
        ne = t->shape;
      }
      if (ne != *shape) {
        std::vector<int64_t> hf_want(shape->rbegin(), shape->rend());
        if (m.transpose) hf_want = *shape;
        return absl::InvalidArgumentError(
            absl::StrCat("hf: tensor '", hf_name, "' ('", m.gguf_name, "') has shape ",
                         ShapeString(t->shape), ", the config needs ", ShapeString(hf_want)));
      }
      Entry& e = tensors_[m.gguf_name];
      e.ref.name = m.gguf_name;
      e.ref.ne = ne;
      if (m.transpose) {
        Transpose(*t, &e);
      } else if (gemma && m.gguf_name.ends_with("norm.weight")) {
        e.owned.resize(t->nbytes / SafetensorsDtypeSize(t->dtype) * sizeof(float));
        float* dst = reinterpret_cast<float*>(e.owned.data());
        for (size_t i = 0; i < e.owned.size() / sizeof(float); ++i)
          dst[i] = 1.0f + LoadElement(t->data + i * SafetensorsDtypeSize(t->dtype), t->dtype);
        e.ref.type = GgmlType::kF32;
        e.ref.nbytes = e.owned.size();
        e.ref.data = e.owned.data();
      } else {
        e.ref.type = SafetensorsToGgml(t->dtype);
        e.ref.nbytes = t->nbytes;
        const size_t elem = SafetensorsDtypeSize(t->dtype);
        if (reinterpret_cast<uintptr_t>(t->data) % elem == 0) {
          e.ref.data = t->data;
        } else {  // a header not padded to the element size: keep kernels' loads aligned
          e.owned.assign(t->data, t->data + t->nbytes);
          e.ref.data = e.owned.data();
        }
      }
    }
    for (const auto& [gguf_name, ne] : want) {
      if (tensors_.count(gguf_name) == 0) {
        return absl::NotFoundError(absl::StrCat("hf: ", dir_, " has no tensor '",
                                                HfNameForGguf(c.arch, gguf_name, gemma), "' (for '",
                                                gguf_name, "', shape ", ShapeString(ne), ")"));
      }
    }
    return absl::OkStatus();
  }

  // Conv1D weight [in, out] -> F32 rows: dst[o * in + i] = src[i * out + o].
  static void Transpose(const SafetensorsTensor& t, Entry* e) {
    const int64_t in = t.shape[0], out = t.shape[1];
    const size_t elem = SafetensorsDtypeSize(t.dtype);
    e->owned.resize(static_cast<size_t>(in * out) * sizeof(float));
    float* dst = reinterpret_cast<float*>(e->owned.data());
    for (int64_t i = 0; i < in; ++i) {
      const uint8_t* row = t.data + static_cast<size_t>(i * out) * elem;
      for (int64_t o = 0; o < out; ++o) dst[o * in + i] = LoadElement(row + o * elem, t.dtype);
    }
    e->ref.type = GgmlType::kF32;
    e->ref.data = e->owned.data();
    e->ref.nbytes = e->owned.size();
  }

  std::string dir_;
  ModelConfig config_;
  TokenizerData tokenizer_;
  std::unique_ptr<SafetensorsCheckpoint> ckpt_;
  std::map<std::string, Entry> tensors_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<WeightSource>> OpenHfWeightSource(const std::string& dir) {
  TS_ASSIGN_OR_RETURN(auto src, HfWeightSource::Open(dir));
  return std::unique_ptr<WeightSource>(std::move(src));
}

}  // namespace tinyserve
