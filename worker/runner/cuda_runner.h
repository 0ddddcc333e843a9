// File: worker/runner/cuda_runner.h
// The engine's runner on a GPU (`--device cuda`): loads a Llama-family model from any
// WeightSource (GGUF or Hugging Face; quantized tensors are dequantized on the host and uploaded
// as f16) into kernels/cuda/device_model.h, which owns the device weights and the paged KV cache,
// and runs the engine's batches (prefill chunks and decode tokens) on the device with CUDA
// graphs for decode steps. The engine's PagePool allocates pages exactly as for the CPU runner;
// page ids index the device cache.
//
// Token selection on the GPU is the fused Quest kernel (dense or quest, per sequence from its
// SelectionSpec); other policies are CPU-only and rejected by the engine. LoRA adapters run as on
// the CPU (y += scale·(x·Aᵀ)·Bᵀ per adapted projection, rows of other adapters untouched), through
// two more cuBLAS GEMMs per run of rows sharing an adapter. Tensor parallelism and GPT-2 are
// CPU-only for now (Unimplemented).
//
// Built with the CUDA backend (nvcc and the cuBLAS headers found; cuBLAS itself is loaded at run
// time); without it Create returns FailedPrecondition.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/device_model.h"
#include "worker/model/lora_adapter.h"
#include "worker/model/model_config.h"
#include "worker/runner/transformer.h"
#include "worker/select/selection_spec.h"
#include "worker/select/selection_stats.h"

namespace tinyserve {

class WeightSource;

struct CudaRunnerOptions {
  int page_size = 16;
  int64_t num_pages = 0;
  int max_batch = 16;
  int max_tokens = 528;      // rows per step: prefill chunk budget + decode batch
  int max_context = 0;       // 0: the model's
  int device_pages = 0;      // tiered KV: device page slots per tiered layer (0: off)
  int resident_layers = 2;   // tiered KV: layers kept wholly on the device
  bool cuda_graphs = true;
  int device = 0;
};

// Totals since creation, for logs and metrics.
struct CudaRunnerTotals {
  int64_t steps = 0, graph_steps = 0;
  int64_t pages_attended = 0, pages_total = 0;
  int64_t tier_hits = 0, tier_misses = 0, bytes_moved = 0, bytes_direct = 0;
};

class CudaRunner {
 public:
  static absl::StatusOr<std::unique_ptr<CudaRunner>> Create(const WeightSource& source,
                                                            const CudaRunnerOptions& options);
  ~CudaRunner();

  const ModelConfig& config() const { return config_; }
  // Device bytes of one KV page (all layers, K, V and key boxes).
  static int64_t KvBytesPerPage(const ModelConfig& config, int page_size);
  // Whether this build has the CUDA runner.
  static bool Available();

  // As TransformerRunner::Forward; selection[i] is the spec of batch[i] for its decode token
  // (null: dense). batch[i].selector is ignored.
  absl::Status Forward(const std::vector<SeqInput>& batch,
                       const std::vector<const SelectionSpec*>& selection,
                       std::vector<float>* logits);
  const CudaRunnerTotals& totals() const { return totals_; }

  // LoRA adapters, as TransformerRunner's (ids 1, 2, ... in the order installed, never reused;
  // SeqInput::lora names one): PrepareLora reads an adapter and lays it out for the device (the
  // slow part; const, so it may run beside Forward on another thread), InstallLora uploads it
  // between Forwards (fails only on a device error, such as out of memory), RemoveLora frees it.
  using PreparedLora = std::vector<cuda::DeviceLoraLayer>;  // [layer]
  absl::StatusOr<PreparedLora> PrepareLora(const LoraAdapter& adapter) const;
  absl::StatusOr<int> InstallLora(const PreparedLora& lora);
  void RemoveLora(int id);
  absl::StatusOr<int> AddLora(const LoraAdapter& adapter);
  // Selection accounting of batch[i]'s decode step in the last Forward (false: not a decode).
  bool StepStatsOf(size_t i, StepStats* out) const;

 private:
  struct Impl;
  CudaRunner();
  ModelConfig config_;
  std::unique_ptr<Impl> impl_;
  CudaRunnerTotals totals_;
};

// InvalidArgument naming the field when spec cannot run on the GPU (policies other than dense
// and quest, recent pages, oracle sampling).
absl::Status ValidateCudaSelection(const SelectionSpec& spec);

}  // namespace tinyserve
