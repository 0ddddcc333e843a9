// File: worker/model/lora_adapter.h
// A LoRA adapter: the low-rank update of some of a base model's projection weights,
// W' = W + scale·B·A, applied per request (multi-LoRA).
//
// Two formats:
//   - llama.cpp's GGUF (convert_lora_to_gguf.py): general.type = "adapter", adapter.type =
//     "lora", general.architecture as the base model's, adapter.lora.alpha (optional; 0 or
//     absent: scale 1), and per adapted weight `<base name>.lora_a` with ne = [in, r] and
//     `<base name>.lora_b` with ne = [r, out], in any type the CPU dequantizes. scale = alpha/r.
//     GGUF adapters are made against GGUF base models, whose Q/K rows llama.cpp's converter
//     permutes for RoPE; on a Hugging Face base (rotate-half RoPE) that pairing is refused.
//   - a PEFT folder (what PEFT's save_pretrained writes and vLLM loads): adapter_config.json
//     and adapter_model.safetensors (worker/hf/peft_lora.cc, built with worker/hf). scale =
//     lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora. Llama-family models; on a GGUF
//     base the Q and K updates' rows are permuted as llama.cpp's converter permutes the weights.
//
// Adaptable weights: blk.N.{attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up,
// ffn_down}.weight (llama) and blk.N.{attn_qkv, attn_output, ffn_up, ffn_down}.weight (gpt2).
// Anything else (embeddings, the LM head, unknown names), a half pair, a shape that does not fit
// the base model or another architecture is an InvalidArgument naming the tensor or key, when
// the adapter is opened: a bad adapter fails at start-up, never mid-request.
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
  TensorRef a;      // ne = [in, r]: r rows of `in`
  TensorRef b;      // ne = [r, out]: `out` rows of r
  float scale = 1;  // the update is scale·B·A
  int rank() const { return static_cast<int>(a.ne[1]); }
};

class LoraAdapter {
 public:
  // Opens and checks `path` (a GGUF file, or a PEFT folder) against the base model `base` (the
  // config of the loaded model). NotFound when the path does not exist.
  static absl::StatusOr<std::unique_ptr<LoraAdapter>> Open(const std::string& name,
                                                           const std::string& path,
                                                           const ModelConfig& base);
  // The GGUF reader behind Open, for a file already parsed (`path` names it in errors; tests and
  // the GGUF fuzzer use it on bytes in memory).
  static absl::StatusOr<std::unique_ptr<LoraAdapter>> FromGguf(const std::string& name,
                                                               const std::string& path,
                                                               std::shared_ptr<const GgufFile> file,
                                                               const ModelConfig& base);
  // Checks pairs read by a format's reader against `base` (names and shapes) and wraps them;
  // `storage` keeps their bytes alive.
  static absl::StatusOr<std::unique_ptr<LoraAdapter>> Make(const std::string& name,
                                                           const std::string& path,
                                                           const ModelConfig& base, float alpha,
                                                           std::map<std::string, LoraPair> pairs,
                                                           std::shared_ptr<const void> storage);

  const std::string& name() const { return name_; }
  const std::string& path() const { return path_; }
  float alpha() const { return alpha_; }
  int max_rank() const { return max_rank_; }
  // The pair adapting base weight `name` (e.g. "blk.0.attn_q.weight"), or null.
  const LoraPair* Find(const std::string& name) const;
  size_t num_pairs() const { return pairs_.size(); }

 private:
  LoraAdapter() = default;

  std::string name_, path_;
  float alpha_ = 0;
  int max_rank_ = 0;
  std::shared_ptr<const void> storage_;
  std::map<std::string, LoraPair> pairs_;
};

// The InvalidArgument every adapter error is: "LoRA adapter 'NAME' (PATH): WHAT".
absl::Status LoraError(const std::string& name, const std::string& path, const std::string& what);

// A PEFT folder (worker/hf/peft_lora.cc); declared here so that Open can reach it when worker/hf
// is built (TINYSERVE_HAVE_HF).
absl::StatusOr<std::unique_ptr<LoraAdapter>> OpenPeftLoraAdapter(const std::string& name,
                                                                 const std::string& dir,
                                                                 const ModelConfig& base);

// A LoRA adapter to load: its name (what requests ask for) and GGUF file or PEFT folder.
struct LoraModule {
  std::string name, path;
};

// What a loaded adapter is, for GetModelInfo and /v1/models.
struct LoraInfo {
  std::string name, path;
  int max_rank = 0;
  float alpha = 0;
  int tensors = 0;  // weights it updates (per layer and projection)
  bool runtime = false;  // loaded at run time (Engine::LoadLora), not given at start
  double loaded_at = 0;  // a run-time load's Unix time (or that of the load it copies)
};

// A digest of the adapters' names, ranks and tensor counts in order (not paths, which may
// differ between hosts): tensor-parallel ranks compare it, since a sequence's adapter travels
// as its index.
uint64_t LoraDigest(const std::vector<LoraInfo>& loras);
// 1 + the index of the adapter named `name`, or 0 when there is none.
int LoraId(const std::vector<LoraInfo>& loras, const std::string& name);

// Parses "NAME=PATH" (the --lora flag; PATH a GGUF adapter or a PEFT folder). NAME: 1-64
// characters of [A-Za-z0-9._:/-], not starting with '.' or '-'.
absl::Status ParseLoraFlag(const std::string& flag, std::string* name, std::string* path);
// InvalidArgument unless `name` is such a name.
absl::Status CheckLoraName(const std::string& name);

}  // namespace tinyserve
