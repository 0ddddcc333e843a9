// The GGUF WeightSource (declared in worker/model/weight_source.h): ModelConfig and
// TokenizerData from the metadata (keys in shared/reference/model-formats.md §1.4, §6.4, §8, §9),
// tensors as views into the file's memory map. Every tensor the runners will read is checked
// against the config when the file is opened, so a bad file fails here and not mid-forward.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "worker/gguf/gguf_file.h"
#include "worker/model/weight_source.h"

namespace tinyserve {
namespace {

// A GGUF id field meaning "none".
constexpr int64_t kNoToken = 0xFFFFFFFF;

// Control tokens that end a turn in common chat vocabularies; llama.cpp's list
// (src/llama-vocab.cpp) treats them as end-of-generation whatever the EOS id is.
constexpr std::string_view kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>",       "<|return|>", "<|call|>",        "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>",
};

class MetadataReader {
 public:
  MetadataReader(const GgufFile& file, std::string prefix)
      : file_(file), prefix_(std::move(prefix)) {}

  std::string Key(std::string_view suffix) const { return absl::StrCat(prefix_, ".", std::string(suffix)); }

  // A positive int that fits in int; `fallback` when absent (nullopt: required).
  absl::StatusOr<int> PositiveInt(std::string_view suffix,
                                  std::optional<int> fallback = std::nullopt) const {
    const std::string key = Key(suffix);
    if (file_.Find(key) == nullptr) {
      if (fallback) return *fallback;
      return absl::InvalidArgumentError(absl::StrCat("gguf: missing required kv '", key, "'"));
    }
    TS_ASSIGN_OR_RETURN(const int64_t v, file_.GetInt(key));
    if (v <= 0 || v > std::numeric_limits<int>::max())
      return absl::InvalidArgumentError(
          absl::StrCat("gguf: kv '", key, "' = ", v, " is out of range (must be in [1, 2^31))"));
    return static_cast<int>(v);
  }

  absl::StatusOr<float> Float(std::string_view suffix, float fallback) const {
    const std::string key = Key(suffix);
    if (file_.Find(key) == nullptr) return fallback;
    TS_ASSIGN_OR_RETURN(const double v, file_.GetFloat(key));
    if (!(v > 0) || v > std::numeric_limits<float>::max())
      return absl::InvalidArgumentError(
          absl::StrCat("gguf: kv '", key, "' = ", v, " must be positive and finite"));
    return static_cast<float>(v);
  }

 private:
  const GgufFile& file_;
  std::string prefix_;
};

// Drops trailing 1s beyond the first dimension, so [576] and [576, 1] compare equal.
std::vector<int64_t> Squeeze(std::vector<int64_t> ne) {
  while (ne.size() > 1 && ne.back() == 1) ne.pop_back();
  return ne;
}

class GgufWeightSource final : public WeightSource {
 public:
  GgufWeightSource(std::string path, std::unique_ptr<GgufFile> file)
      : path_(std::move(path)), file_(std::move(file)) {}

  absl::Status Init() {
    TS_ASSIGN_OR_RETURN(const std::string arch, file_->GetString("general.architecture"));
    arch_name_ = arch;
    TS_RETURN_IF_ERROR(LoadTokenizer());
    if (arch == "llama" || arch == "qwen2" || arch == "qwen3") {
      TS_RETURN_IF_ERROR(LoadConfig(Arch::kLlama, arch));
      if (arch != "llama") {
        // Llamas whose Q/K rows llama.cpp's converter leaves in Hugging Face order: NEOX
        // (rotate-half) RoPE. qwen2 adds Q/K/V biases, qwen3 per-head Q/K RMSNorms.
        config_.variant = arch;
        config_.rope_style = RopeStyle::kRotateHalf;
        config_.qk_norm = arch == "qwen3";
      }
      TS_RETURN_IF_ERROR(CheckLlamaShapes());
      TS_RETURN_IF_ERROR(LoadRopeFactors());
    } else if (arch == "gemma3") {
      TS_RETURN_IF_ERROR(LoadConfig(Arch::kLlama, arch));
      TS_RETURN_IF_ERROR(LoadGemma3());
      TS_RETURN_IF_ERROR(CheckLlamaShapes());
    } else if (arch == "gpt2") {
      TS_RETURN_IF_ERROR(LoadConfig(Arch::kGpt2, arch));
      TS_RETURN_IF_ERROR(CheckGpt2Shapes());
    } else {
      return absl::InvalidArgumentError(absl::StrCat("gguf: unsupported architecture '", arch,
                                                     "' (general.architecture); TinyServe "
                                                     "reads llama, qwen2, qwen3, gemma3 and gpt2"));
    }
    return absl::OkStatus();
  }

  const ModelConfig& config() const override { return config_; }
  const TokenizerData& tokenizer_data() const override { return tokenizer_; }

  absl::StatusOr<TensorRef> Get(const std::string& name) const override {
    const GgufTensorInfo* t = file_->FindTensor(name);
    if (t == nullptr)
      return absl::NotFoundError(absl::StrCat("gguf: no tensor '", name, "' in ", path_));
    TensorRef ref;
    ref.name = t->name;
    ref.type = t->type;
    ref.ne = t->ne;
    ref.data = t->data;
    ref.nbytes = t->nbytes;
    return ref;
  }

  bool Has(const std::string& name) const override { return file_->FindTensor(name) != nullptr; }
  void DropPages(const void* data, size_t bytes) const override { file_->DropPages(data, bytes); }

  std::string Describe() const override {
    return absl::StrCat("gguf v", file_->version(), " ", path_);
  }

 private:
  absl::Status LoadConfig(Arch arch, const std::string& prefix) {
    const MetadataReader md(*file_, prefix);
    ModelConfig& c = config_;
    c.arch = arch;
    if (const GgufValue* n = file_->Find("general.name"); n != nullptr && n->AsString())
      c.name = *n->AsString();
    TS_ASSIGN_OR_RETURN(c.n_layers, md.PositiveInt("block_count"));
    TS_ASSIGN_OR_RETURN(c.dim, md.PositiveInt("embedding_length"));
    TS_ASSIGN_OR_RETURN(c.n_heads, md.PositiveInt("attention.head_count"));
    TS_ASSIGN_OR_RETURN(c.n_kv_heads, md.PositiveInt("attention.head_count_kv", c.n_heads));
    TS_ASSIGN_OR_RETURN(c.max_context, md.PositiveInt("context_length"));
    const int vocab_from_tokens = static_cast<int>(tokenizer_.tokens.size());
    TS_ASSIGN_OR_RETURN(c.vocab_size, md.PositiveInt("vocab_size", vocab_from_tokens));
    if (arch == Arch::kLlama) {
      TS_ASSIGN_OR_RETURN(c.ffn_dim, md.PositiveInt("feed_forward_length"));
      TS_ASSIGN_OR_RETURN(c.norm_eps, md.Float("attention.layer_norm_rms_epsilon", 1e-5f));
      TS_ASSIGN_OR_RETURN(c.rope_theta, md.Float("rope.freq_base", 10000.0f));
      c.rope_style = RopeStyle::kAdjacent;
    } else {
      TS_ASSIGN_OR_RETURN(c.ffn_dim, md.PositiveInt("feed_forward_length", 4 * c.dim));
      TS_ASSIGN_OR_RETURN(c.norm_eps, md.Float("attention.layer_norm_epsilon", 1e-5f));
      c.rope_style = RopeStyle::kNone;
    }
    if (c.dim % c.n_heads != 0 && file_->Find(md.Key("attention.key_length")) == nullptr)
      return absl::InvalidArgumentError(absl::StrCat(
          "gguf: ", md.Key("embedding_length"), " = ", c.dim, " is not a multiple of ",
          md.Key("attention.head_count"), " = ", c.n_heads));
    if (c.n_heads % c.n_kv_heads != 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "gguf: ", md.Key("attention.head_count"), " = ", c.n_heads, " is not a multiple of ",
          md.Key("attention.head_count_kv"), " = ", c.n_kv_heads));
    // The head size: attention.key_length (Qwen3's 128 with 1,024 / 16 heads), else hidden /
    // heads. Shapes TinyServe does not run are refused by name rather than computed wrongly.
    TS_ASSIGN_OR_RETURN(c.head_dim, md.PositiveInt("attention.key_length", c.dim / c.n_heads));
    TS_ASSIGN_OR_RETURN(const int value_length,
                        md.PositiveInt("attention.value_length", c.head_dim));
    if (value_length != c.head_dim || c.head_dim <= 0 ||
        (arch == Arch::kLlama && c.head_dim % 2 != 0) ||
        (arch == Arch::kGpt2 && c.head_dim * c.n_heads != c.dim))
      return absl::InvalidArgumentError(
          absl::StrCat("gguf: ", md.Key("attention.value_length"), " = ", value_length, " with ",
                       md.Key("attention.key_length"), " = ", c.head_dim,
                       " is not supported (TinyServe needs equal, even K and V head sizes)"));
    if (arch == Arch::kLlama) {
      TS_ASSIGN_OR_RETURN(const int n, md.PositiveInt("rope.dimension_count", c.head_dim));
      if (n != c.head_dim)
        return absl::InvalidArgumentError(
            absl::StrCat("gguf: ", md.Key("rope.dimension_count"), " = ", n,
                         " is not supported (partial RoPE; TinyServe rotates all ", c.head_dim,
                         " channels of a head)"));
      TS_RETURN_IF_ERROR(LoadRopeScaling(md));  // after head_dim: YaRN's factors need it
    }
    if (c.vocab_size != vocab_from_tokens)
      return absl::InvalidArgumentError(absl::StrCat(
          "gguf: ", md.Key("vocab_size"), " = ", c.vocab_size,
          " disagrees with the ", vocab_from_tokens, " entries of tokenizer.ggml.tokens"));
    c.tied_embeddings = !file_->FindTensor("output.weight");
    return absl::OkStatus();
  }

  // rope.scaling.type: none, linear with rope.scaling.factor, or yarn (Qwen2.5's and Qwen3's
  // long-context setting) as llama.cpp reads it: factor, original_context_length (default the
  // context length), yarn_beta_fast / yarn_beta_slow (32 / 1), yarn_ext_factor (1) and
  // attn_factor (1, times YaRN's 0.1 ln(factor) + 1); others are refused.
  absl::Status LoadRopeScaling(const MetadataReader& md) {
    const std::string key = md.Key("rope.scaling.type");
    if (file_->Find(key) == nullptr) return absl::OkStatus();
    TS_ASSIGN_OR_RETURN(const std::string type, file_->GetString(key));
    if (type == "none") return absl::OkStatus();
    if (type != "linear" && type != "yarn")
      return absl::InvalidArgumentError(absl::StrCat("gguf: kv '", key, "' = '", type,
                                                     "' is not supported (none, linear, yarn)"));
    TS_ASSIGN_OR_RETURN(const float factor, md.Float("rope.scaling.factor", 1.0f));
    if (type == "linear") {
      config_.rope_freq_scale = 1.0f / factor;
      return absl::OkStatus();
    }
    ModelConfig& c = config_;
    TS_ASSIGN_OR_RETURN(const int old_ctx,
                        md.PositiveInt("rope.scaling.original_context_length", c.max_context));
    TS_ASSIGN_OR_RETURN(const float beta_fast, md.Float("rope.scaling.yarn_beta_fast", 32.0f));
    TS_ASSIGN_OR_RETURN(const float beta_slow, md.Float("rope.scaling.yarn_beta_slow", 1.0f));
    TS_ASSIGN_OR_RETURN(const float attn, md.Float("rope.scaling.attn_factor", 1.0f));
    const std::string ext_key = md.Key("rope.scaling.yarn_ext_factor");
    if (file_->Find(ext_key) != nullptr) {
      TS_ASSIGN_OR_RETURN(const double e, file_->GetFloat(ext_key));
      if (e != 1.0 && e >= 0)  // llama.cpp reads a negative value as "the default", 1
        return absl::InvalidArgumentError(
            absl::StrCat("gguf: kv '", ext_key, "' = ", e, " is not supported (1)"));
    }
    if (factor <= 1.0f) return absl::OkStatus();  // llama.cpp: no interpolation, no mscale
    c.rope_freq_factors =
        YarnFreqDivisors(c.head_dim, c.rope_theta, factor, old_ctx, beta_fast, beta_slow);
    c.rope_attn_factor = static_cast<float>(attn * YarnMscale(factor));
    // The context it extends to: the original times the factor (llama.cpp takes any -c).
    c.max_context = std::max(c.max_context, YarnContext(old_ctx, factor));
    return absl::OkStatus();
  }

  // Gemma 3 as llama.cpp runs it: NEOX RoPE, per-head Q/K norms, post-norms, GeGLU, embeddings
  // times sqrt(dim), every sixth layer global and the others sliding (window
  // attention.sliding_window, RoPE base 10,000 unscaled); the norm weights in the file already
  // hold Gemma's 1 + w.
  absl::Status LoadGemma3() {
    ModelConfig& c = config_;
    const MetadataReader md(*file_, "gemma3");
    for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"})
      if (file_->Find(md.Key(key)) != nullptr)
        return absl::InvalidArgumentError(
            absl::StrCat("gguf: kv '", md.Key(key), "' is not supported (logit soft-capping)"));
    c.variant = "gemma3";
    c.rope_style = RopeStyle::kRotateHalf;
    c.qk_norm = true;
    c.post_norms = true;
    c.gelu_gate = true;
    c.embed_scale = std::sqrt(static_cast<float>(c.dim));
    // Gemma 3 27B (62 layers) scales by hidden / heads, the others by the head size
    // (query_pre_attn_scalar; llama.cpp's rule).
    c.attn_scale =
        1.0f / std::sqrt(static_cast<float>(c.n_layers == 62 ? c.dim / c.n_heads : c.head_dim));
    TS_ASSIGN_OR_RETURN(c.sliding_window, md.PositiveInt("attention.sliding_window"));
    c.swa_layers.resize(c.n_layers);
    for (int l = 0; l < c.n_layers; ++l) c.swa_layers[l] = l % 6 < 5;
    c.rope_theta_swa = 10000.0f;
    if (file_->FindTensor("rope_freqs.weight") != nullptr)
      return absl::InvalidArgumentError(
          "gguf: gemma3 with tensor 'rope_freqs.weight' is not supported");
    return absl::OkStatus();
  }

  // Llama 3's RoPE frequency factors (tensor rope_freqs.weight, head_dim / 2 floats).
  absl::Status LoadRopeFactors() {
    const GgufTensorInfo* t = file_->FindTensor("rope_freqs.weight");
    if (t == nullptr) return absl::OkStatus();
    const int64_t half = config_.head_dim / 2;
    TS_RETURN_IF_ERROR(Expect("rope_freqs.weight", {half}));
    if (t->type != GgmlType::kF32)
      return absl::InvalidArgumentError(absl::StrCat("gguf: tensor 'rope_freqs.weight' is ",
                                                     std::string(GgmlTypeName(t->type)),
                                                     ", expected F32"));
    std::vector<float> f(half);
    std::memcpy(f.data(), t->data, half * sizeof(float));
    for (int64_t i = 0; i < half; ++i)
      if (!(f[i] > 0) || !std::isfinite(f[i]))
        return absl::InvalidArgumentError(absl::StrCat(
            "gguf: tensor 'rope_freqs.weight'[", i, "] = ", f[i], " must be positive and finite"));
    // With YaRN too, llama.cpp divides the base frequency by both.
    std::vector<float>& have = config_.rope_freq_factors;
    for (size_t i = 0; i < have.size() && i < f.size(); ++i) f[i] *= have[i];
    have = std::move(f);
    return absl::OkStatus();
  }

  absl::Status Expect(const std::string& name, std::vector<int64_t> want) const {
    const GgufTensorInfo* t = file_->FindTensor(name);
    if (t == nullptr)
      return absl::InvalidArgumentError(absl::StrCat(
          "gguf: tensor '", name, "' is missing (the ", arch_name_, " runner needs it)"));
    if (Squeeze(t->ne) != Squeeze(want))
      return absl::InvalidArgumentError(absl::StrCat(
          "gguf: tensor '", name, "' has ne = ", ShapeString(t->ne), " but the config needs ",
          ShapeString(want)));
    return absl::OkStatus();
  }

  absl::Status CheckLlamaShapes() const {
    const ModelConfig& c = config_;
    const int64_t q = int64_t{c.n_heads} * c.head_dim, kv = int64_t{c.n_kv_heads} * c.head_dim;
    TS_RETURN_IF_ERROR(Expect("token_embd.weight", {c.dim, c.vocab_size}));
    TS_RETURN_IF_ERROR(Expect("output_norm.weight", {c.dim}));
    if (!c.tied_embeddings) TS_RETURN_IF_ERROR(Expect("output.weight", {c.dim, c.vocab_size}));
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string p = absl::StrCat("blk.", l, ".");
      TS_RETURN_IF_ERROR(Expect(p + "attn_norm.weight", {c.dim}));
      TS_RETURN_IF_ERROR(Expect(p + "attn_q.weight", {c.dim, q}));
      TS_RETURN_IF_ERROR(Expect(p + "attn_k.weight", {c.dim, kv}));
      TS_RETURN_IF_ERROR(Expect(p + "attn_v.weight", {c.dim, kv}));
      TS_RETURN_IF_ERROR(Expect(p + "attn_output.weight", {q, c.dim}));
      for (const auto& [bias, n] : {std::pair{"attn_q.bias", q}, std::pair{"attn_k.bias", kv},
                                    std::pair{"attn_v.bias", kv}})
        if (file_->FindTensor(p + bias) != nullptr) TS_RETURN_IF_ERROR(Expect(p + bias, {n}));
      if (c.qk_norm) {
        TS_RETURN_IF_ERROR(Expect(p + "attn_q_norm.weight", {c.head_dim}));
        TS_RETURN_IF_ERROR(Expect(p + "attn_k_norm.weight", {c.head_dim}));
      }
      TS_RETURN_IF_ERROR(Expect(p + "ffn_norm.weight", {c.dim}));
      if (c.post_norms) {
        TS_RETURN_IF_ERROR(Expect(p + "post_attention_norm.weight", {c.dim}));
        TS_RETURN_IF_ERROR(Expect(p + "post_ffw_norm.weight", {c.dim}));
      }
      TS_RETURN_IF_ERROR(Expect(p + "ffn_gate.weight", {c.dim, c.ffn_dim}));
      TS_RETURN_IF_ERROR(Expect(p + "ffn_up.weight", {c.dim, c.ffn_dim}));
      TS_RETURN_IF_ERROR(Expect(p + "ffn_down.weight", {c.ffn_dim, c.dim}));
    }
    return absl::OkStatus();
  }

  absl::Status CheckGpt2Shapes() const {
    const ModelConfig& c = config_;
    const int64_t qkv = int64_t{c.n_heads + 2 * c.n_kv_heads} * c.head_dim;
    TS_RETURN_IF_ERROR(Expect("token_embd.weight", {c.dim, c.vocab_size}));
    TS_RETURN_IF_ERROR(Expect("position_embd.weight", {c.dim, c.max_context}));
    TS_RETURN_IF_ERROR(Expect("output_norm.weight", {c.dim}));
    TS_RETURN_IF_ERROR(Expect("output_norm.bias", {c.dim}));
    if (!c.tied_embeddings) TS_RETURN_IF_ERROR(Expect("output.weight", {c.dim, c.vocab_size}));
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string p = absl::StrCat("blk.", l, ".");
      TS_RETURN_IF_ERROR(Expect(p + "attn_norm.weight", {c.dim}));
      TS_RETURN_IF_ERROR(Expect(p + "attn_norm.bias", {c.dim}));
      TS_RETURN_IF_ERROR(Expect(p + "attn_qkv.weight", {c.dim, qkv}));
      TS_RETURN_IF_ERROR(Expect(p + "attn_qkv.bias", {qkv}));
      TS_RETURN_IF_ERROR(Expect(p + "attn_output.weight", {c.dim, c.dim}));
      TS_RETURN_IF_ERROR(Expect(p + "attn_output.bias", {c.dim}));
      TS_RETURN_IF_ERROR(Expect(p + "ffn_norm.weight", {c.dim}));
      TS_RETURN_IF_ERROR(Expect(p + "ffn_norm.bias", {c.dim}));
      TS_RETURN_IF_ERROR(Expect(p + "ffn_up.weight", {c.dim, c.ffn_dim}));
      TS_RETURN_IF_ERROR(Expect(p + "ffn_up.bias", {c.ffn_dim}));
      TS_RETURN_IF_ERROR(Expect(p + "ffn_down.weight", {c.ffn_dim, c.dim}));
      TS_RETURN_IF_ERROR(Expect(p + "ffn_down.bias", {c.dim}));
    }
    return absl::OkStatus();
  }

  // A token id field: -1 when absent or 0xFFFFFFFF; otherwise it must index the vocabulary.
  absl::StatusOr<int32_t> TokenId(const std::string& key) const {
    if (file_->Find(key) == nullptr) return -1;
    TS_ASSIGN_OR_RETURN(const int64_t id, file_->GetInt(key));
    if (id == kNoToken || id == -1) return -1;
    if (id < 0 || id >= static_cast<int64_t>(tokenizer_.tokens.size()))
      return absl::InvalidArgumentError(absl::StrCat("gguf: kv '", key, "' = ", id,
                                                     " is not a token id (vocabulary of ",
                                                     tokenizer_.tokens.size(), ")"));
    return static_cast<int32_t>(id);
  }

  absl::StatusOr<bool> BoolOr(const std::string& key, bool fallback) const {
    const GgufValue* v = file_->Find(key);
    if (v == nullptr) return fallback;
    if (auto b = v->AsBool()) return *b;
    return absl::InvalidArgumentError(absl::StrCat("gguf: kv '", key, "' holds ",
                                                   std::string(GgufValueTypeName(v->type)),
                                                   ", expected bool"));
  }

  absl::Status LoadTokenizer() {
    TokenizerData& t = tokenizer_;
    TS_ASSIGN_OR_RETURN(t.model, file_->GetString("tokenizer.ggml.model"));
    if (t.model != "llama" && t.model != "gpt2")
      return absl::InvalidArgumentError(absl::StrCat(
          "gguf: kv 'tokenizer.ggml.model' = '", t.model, "' is not supported (llama, gpt2)"));
    if (file_->Find("tokenizer.ggml.pre") != nullptr) {
      TS_ASSIGN_OR_RETURN(t.pre, file_->GetString("tokenizer.ggml.pre"));
    }
    TS_ASSIGN_OR_RETURN(t.tokens, file_->GetStringArray("tokenizer.ggml.tokens"));
    if (t.tokens.empty() || t.tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
      return absl::InvalidArgumentError(absl::StrCat(
          "gguf: kv 'tokenizer.ggml.tokens' has ", t.tokens.size(), " entries"));
    const size_t n = t.tokens.size();
    if (file_->Find("tokenizer.ggml.scores") != nullptr) {
      TS_ASSIGN_OR_RETURN(const std::vector<double> scores,
                          file_->GetFloatArray("tokenizer.ggml.scores"));
      if (scores.size() != n)
        return absl::InvalidArgumentError(absl::StrCat(
            "gguf: kv 'tokenizer.ggml.scores' has ", scores.size(), " entries, tokens has ", n));
      t.scores.assign(scores.begin(), scores.end());
    }
    if (file_->Find("tokenizer.ggml.token_type") != nullptr) {
      TS_ASSIGN_OR_RETURN(const std::vector<int64_t> types,
                          file_->GetIntArray("tokenizer.ggml.token_type"));
      if (types.size() != n)
        return absl::InvalidArgumentError(absl::StrCat("gguf: kv 'tokenizer.ggml.token_type' has ",
                                                       types.size(), " entries, tokens has ", n));
      t.types.reserve(n);
      for (size_t i = 0; i < n; ++i) {
        if (types[i] < 0 || types[i] > static_cast<int64_t>(TokenType::kByte))
          return absl::InvalidArgumentError(absl::StrCat(
              "gguf: kv 'tokenizer.ggml.token_type'[", i, "] = ", types[i], " is not a type"));
        t.types.push_back(static_cast<TokenType>(types[i]));
      }
    }
    if (file_->Find("tokenizer.ggml.merges") != nullptr) {
      TS_ASSIGN_OR_RETURN(t.merges, file_->GetStringArray("tokenizer.ggml.merges"));
    } else if (t.model == "gpt2") {
      return absl::InvalidArgumentError(
          "gguf: a gpt2 (byte-level BPE) tokenizer needs kv 'tokenizer.ggml.merges'");
    }
    TS_ASSIGN_OR_RETURN(t.bos_id, TokenId("tokenizer.ggml.bos_token_id"));
    TS_ASSIGN_OR_RETURN(t.eos_id, TokenId("tokenizer.ggml.eos_token_id"));
    TS_ASSIGN_OR_RETURN(t.unk_id, TokenId("tokenizer.ggml.unknown_token_id"));
    TS_ASSIGN_OR_RETURN(t.pad_id, TokenId("tokenizer.ggml.padding_token_id"));
    const bool is_llama = t.model == "llama";
    TS_ASSIGN_OR_RETURN(t.add_bos, BoolOr("tokenizer.ggml.add_bos_token", is_llama));
    TS_ASSIGN_OR_RETURN(t.add_space_prefix, BoolOr("tokenizer.ggml.add_space_prefix", is_llama));

    auto add_eog = [&t](int32_t id) {
      if (id >= 0 && std::find(t.eog_ids.begin(), t.eog_ids.end(), id) == t.eog_ids.end())
        t.eog_ids.push_back(id);
    };
    add_eog(t.eos_id);
    for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
      TS_ASSIGN_OR_RETURN(const int32_t id, TokenId(key));
      add_eog(id);
    }
    if (!t.types.empty()) {
      for (size_t i = 0; i < n; ++i) {
        if (t.types[i] != TokenType::kControl) continue;
        for (std::string_view text : kEogTexts)
          if (t.tokens[i] == text) add_eog(static_cast<int32_t>(i));
      }
    }
    if (file_->Find("tokenizer.chat_template") != nullptr) {
      TS_ASSIGN_OR_RETURN(t.chat_template, file_->GetString("tokenizer.chat_template"));
    }
    return absl::OkStatus();
  }

  std::string path_;
  std::unique_ptr<GgufFile> file_;
  std::string arch_name_;
  ModelConfig config_;
  TokenizerData tokenizer_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<WeightSource>> OpenGgufWeightSource(const std::string& path) {
  TS_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  auto source = std::make_unique<GgufWeightSource>(path, std::move(file));
  const absl::Status status = source->Init();
  if (!status.ok()) {
    // A required key that is absent makes the file malformed, not the path missing.
    const absl::StatusCode code = absl::IsNotFound(status) ? absl::StatusCode::kInvalidArgument
                                                           : status.code();
    return absl::Status(code, absl::StrCat(status.message(), " [", path, "]"));
  }
  return std::unique_ptr<WeightSource>(std::move(source));
}

}  // namespace tinyserve
