// File: worker/model/lora_adapter.h
// A LoRA adapter in llama.cpp's GGUF form (convert_lora_to_gguf.py): the low-rank update of some
// of a base model's projection weights, W' = W + scale·B·A, applied per request (multi-LoRA).
//
// The file: general.type = "adapter", adapter.type = "lora", general.architecture as the base
// model's, adapter.lora.alpha (optional; 0 or absent: scale 1), and for each adapted weight
// `<base name>.lora_a` with ne = [in, r] and `<base name>.lora_b` with ne = [r, out], in any
// type the CPU dequantizes (F32, F16, BF16, Q8_0, ...). scale = alpha / r, as llama.cpp and
// PEFT compute it.
//
// Adaptable weights: blk.N.{attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up,
// ffn_down}.weight (llama) and blk.N.{attn_qkv, attn_output, ffn_up, ffn_down}.weight (gpt2).
// Anything else (embeddings, the LM head, unknown names), a half pair, a shape that does not fit
// the base model or another architecture is an InvalidArgument naming the tensor or key, when
// the adapter is opened: a bad adapter fails at start-up, never mid-request.
//
// GGUF adapters are made against GGUF base models, whose Q/K rows llama.cpp's converter
// permutes for RoPE; on a Hugging Face base (rotate-half RoPE) the Q/K updates would not line
// up, so that pairing is refused.
//
// Thread safety: immutable after Open.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/model_config.h"
#include "worker/model/weight_source.h"

namespace tinyserve {

class GgufFile;

struct LoraPair {
  TensorRef a;  // ne = [in, r]: r rows of `in`
  TensorRef b;  // ne = [r, out]: `out` rows of r
  int rank() const { return static_cast<int>(a.ne[1]); }
};

class LoraAdapter {
 public:
  // Opens and checks `path` against the base model `base` (the config of the loaded model).
  static absl::StatusOr<std::unique_ptr<LoraAdapter>> Open(const std::string& name,
                                                           const std::string& path,
                                                           const ModelConfig& base);
  ~LoraAdapter();

  const std::string& name() const { return name_; }
  const std::string& path() const { return path_; }
  float alpha() const { return alpha_; }
  int max_rank() const { return max_rank_; }
  // The update's factor for a pair: alpha / r, or 1 when alpha is 0.
  float Scale(const LoraPair& p) const { return alpha_ != 0 ? alpha_ / p.rank() : 1.0f; }
  // The pair adapting base weight `name` (e.g. "blk.0.attn_q.weight"), or null.
  const LoraPair* Find(const std::string& name) const;
  size_t num_pairs() const { return pairs_.size(); }

 private:
  LoraAdapter() = default;

  std::string name_, path_;
  float alpha_ = 0;
  int max_rank_ = 0;
  std::unique_ptr<GgufFile> file_;
  std::map<std::string, LoraPair> pairs_;
};

// A LoRA adapter to load: its name (what requests ask for) and GGUF file.
struct LoraModule {
  std::string name, path;
};

// What a loaded adapter is, for GetModelInfo and /v1/models.
struct LoraInfo {
  std::string name, path;
  int max_rank = 0;
  float alpha = 0;
  int tensors = 0;  // weights it updates (per layer and projection)
};

// Parses "NAME=PATH" (the --lora flag). NAME: 1-64 characters of [A-Za-z0-9._-], not starting
// with '.' or '-'.
absl::Status ParseLoraFlag(const std::string& flag, std::string* name, std::string* path);

}  // namespace tinyserve
