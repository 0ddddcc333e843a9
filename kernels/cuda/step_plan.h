// File: kernels/cuda/step_plan.h
// The host half of DeviceModel::Forward (plain C++, tested on the CPU): checks a batch and lays
// it out for the kernels. Rows are reordered: decode sequences (one new token) first, grouped by
// attention spec in first-seen order (each group is one decode-attention call; within a group,
// sequences of one LoRA adapter sit together, in first-seen order of adapters), then the prefill
// sequences. Page tables have a fixed width (max_pages_per_seq, padded with page 0) so that a
// decode step's kernels can be captured in a CUDA graph and replayed with new values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/device_model.h"

namespace tinyserve::cuda {

// Decode sequences [begin, begin + size) of the plan share one attention spec.
struct DecodeGroup {
  int begin = 0, size = 0;
  DeviceAttention att;
};

// Rows [row0, row0 + rows) of the plan run LoRA adapter `lora` (never 0).
struct LoraRun {
  int lora = 0, row0 = 0, rows = 0;
  bool operator==(const LoraRun& o) const {
    return lora == o.lora && row0 == o.row0 && rows == o.rows;
  }
};

struct StepLimits {
  int max_batch = 0, max_tokens = 0, max_pages_per_seq = 0, page_size = 16, num_pages = 0,
      vocab = 0;
};

struct StepPlan {
  int n_seq = 0;          // sequences
  int nd = 0;             // decode sequences: plan indices [0, nd)
  int rows = 0;           // token rows (T)
  int max_new = 1;        // most new tokens of one sequence
  int max_q_prefill = 1;  // most new tokens of one prefill sequence
  std::vector<int> order;                     // plan index -> batch index
  std::vector<DecodeGroup> groups;
  std::vector<int> seq_len;                   // by plan index: tokens after this step
  std::vector<std::vector<int32_t>> tables;   // by plan index: the pages those tokens use
  std::vector<int32_t> written;               // pages appended to in this step
  // What the kernels read, by plan index or row.
  std::vector<int32_t> ids, positions;        // [rows]
  std::vector<int32_t> new_indptr;            // [n_seq + 1] rows of each sequence
  std::vector<int32_t> seq_lens;              // [n_seq]
  std::vector<int32_t> page_indptr;           // [n_seq + 1] = k * max_pages_per_seq
  std::vector<int32_t> page_indices;          // [n_seq * max_pages_per_seq]
  std::vector<int32_t> q_indptr;              // [n_seq - nd + 1] rows of each prefill sequence
  std::vector<int32_t> logit_rows;            // rows whose logits are returned, batch order
  // DeviceSeq::hidden sequences, batch order: (first row, rows) pooled into one output row.
  std::vector<int32_t> hidden_spans;          // [2 * sequences asking]
  std::vector<LoraRun> lora_runs;             // maximal runs of rows sharing an adapter
};

// False (and *error naming the problem) for an empty sequence, a token outside the vocabulary,
// a page table that does not cover the tokens or names a page outside the pool, a Quest budget
// below one page, a negative LoRA id, or more sequences, rows or pages than the limits.
bool PlanStep(const std::vector<DeviceSeq>& batch, const StepLimits& limits, StepPlan* plan,
              std::string* error);

}  // namespace tinyserve::cuda
