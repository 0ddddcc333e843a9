// File: worker/model/weight_source.h
// Where a model's configuration, tensors and tokenizer come from: a GGUF file or a Hugging
// Face folder. Both present tensors under the GGUF names (`token_embd.weight`,
// `blk.N.attn_q.weight`, ...) in the GGUF orientation (a 2-D weight has ne = [in, out]: `out`
// rows of `in` elements), so the runners need not know the format.
//
// Names used: token_embd, output_norm, output (absent when tied), and per layer N:
//   llama: blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up,
//          ffn_down}.weight
//   gpt2:  position_embd.weight; blk.N.{attn_norm, ffn_norm}.{weight,bias},
//          blk.N.attn_qkv.{weight,bias} (rows q, then k, then v), blk.N.attn_output.{weight,bias},
//          blk.N.ffn_up.{weight,bias}, blk.N.ffn_down.{weight,bias}; output_norm.{weight,bias}
// HF Conv1D weights (GPT-2) are transposed at load into this orientation.
//
// Thread safety: immutable after Open.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cpu/ggml_types.h"
#include "worker/model/model_config.h"
#include "worker/tokenizer/tokenizer.h"

namespace tinyserve {

struct TensorRef {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> ne;        // GGUF order: ne[0] is the row length
  const uint8_t* data = nullptr;  // valid while the WeightSource lives
  size_t nbytes = 0;
};

// "[a, b]": a tensor's ne (or shape) in error messages.
inline std::string ShapeString(const std::vector<int64_t>& ne) {
  return absl::StrCat("[", absl::StrJoin(ne, ", "), "]");
}

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual const ModelConfig& config() const = 0;
  virtual const TokenizerData& tokenizer_data() const = 0;
  // NotFound naming the tensor if absent.
  virtual absl::StatusOr<TensorRef> Get(const std::string& name) const = 0;
  virtual bool Has(const std::string& name) const = 0;
  // A short description for logs: format and path.
  virtual std::string Describe() const = 0;
  // A tensor's bytes (a Get's data, or part of them) were copied and are not needed in memory
  // now: a source that maps its file lets the kernel drop those pages (read back if used
  // again). Never changes what Get returns.
  virtual void DropPages(const void* /*data*/, size_t /*bytes*/) const {}
};

// Opens a GGUF file or a Hugging Face folder (config.json + *.safetensors + tokenizer.json).
// A missing path is NotFound naming it; anything malformed is InvalidArgument naming what.
absl::StatusOr<std::unique_ptr<WeightSource>> OpenWeightSource(const std::string& path);

// `source` with its RoPE scaling replaced by a rope_scaling JSON object (ApplyRopeScaling in
// worker/hf/hf_config.h; the --rope-scaling flag): InvalidArgument naming the setting when it
// does not parse, Unimplemented for a scaling TinyServe does not run or a model without RoPE.
absl::StatusOr<std::unique_ptr<WeightSource>> WithRopeScaling(std::unique_ptr<WeightSource> source,
                                                              const std::string& rope_scaling_json);

// GGUF: model config and tokenizer data from the metadata.
absl::StatusOr<std::unique_ptr<WeightSource>> OpenGgufWeightSource(const std::string& path);
// Hugging Face folder (worker/hf).
absl::StatusOr<std::unique_ptr<WeightSource>> OpenHfWeightSource(const std::string& dir);

}  // namespace tinyserve
