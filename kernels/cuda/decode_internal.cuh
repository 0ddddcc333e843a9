// File: kernels/cuda/decode_internal.cuh
// Private to decode_attention.cu and quest_select.cu: the workspace carve-up and the selection
// launchers. Not an entry point.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/decode_attention.cuh"

namespace tinyserve::cuda::internal {

// Pieces of DecodeAttentionParams::workspace, each 256-byte aligned.
struct DecodeWorkspace {
  float* partial_o = nullptr;    // [batch][H_q][splits][d] unnormalised split outputs
  float* partial_ml = nullptr;   // [batch][H_q][splits][2] (running max in log2 units, sum)
  int32_t* sel_pages = nullptr;  // [batch][H_kv][budget] physical page ids (quest)
  int32_t* sel_count = nullptr;  // [batch][H_kv] (quest)
  float* scores = nullptr;       // [batch][H_kv][max_pages] split scoring output (quest)
  size_t bytes = 0;              // total
};

// Carves `base` (may be null to only size it).
DecodeWorkspace CarveWorkspace(const DecodeAttentionParams& p, int splits, bool quest,
                               void* base);
int NumSms();
int ChooseScoreSplits(const DecodeAttentionParams& p);

// Selection: fills ws.sel_pages / ws.sel_count (and the optional debug outputs of p).
cudaError_t LaunchQuestSelection(const DecodeAttentionParams& p, const DecodeWorkspace& ws,
                                 cudaStream_t stream);

}  // namespace tinyserve::cuda::internal
