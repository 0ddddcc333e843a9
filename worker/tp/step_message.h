// File: worker/tp/step_message.h
// What rank 0's engine tells the other ranks of a tensor-parallel group, one message per step.
//
// Rank 0 owns scheduling, page allocation and sampling; followers (tp_follower.h) replay each
// step on their own shard and their own PagedKvCache with the same page ids. A message carries:
//   - kind: a step, a heartbeat (liveness while idle: followed by a Barrier on every rank),
//     LoRA changes made at run time (kLora, below), or shutdown (followers return);
//   - finished: sequence ids whose selection policies the followers drop;
//   - reset_pages: pages (re)allocated since the previous message (PagedKvCache::ResetPage);
//   - entries: the batch in order: tokens, start_pos and page table, all_logits, the LoRA
//     adapter, and the
//     policy calls around the forward (BeginStep(begin_tokens) when `select`, OnPrefill
//     afterwards when `prefill_done`), with the SelectionSpec and seed the first time a
//     sequence appears so the follower can create its own Policy.
//
// kLora carries adapters loaded at run time (Engine::LoadLora), in id order, and the ids of
// unloaded ones to free. Every rank reads each load's path (the same path must resolve to the
// same adapter on every host, as for --lora), then all meet in AgreeOnLoraLoads, and each installs,
// in order, exactly the loads no rank failed, so adapter ids stay the same on every rank.
//
// Transport (SendStepMessage / ReceiveStepMessage): one Broadcast from rank 0 of a fixed
// kFirstChunk-byte block (length + the start of the payload), and a second Broadcast for the
// rest when the payload does not fit (large prefills, long page tables).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/select/selection_spec.h"
#include "worker/tp/communicator.h"

namespace tinyserve {

struct StepEntry {
  uint64_t seq = 0;                 // engine-wide sequence id (not the request id)
  std::vector<int32_t> tokens;      // new tokens
  int64_t start_pos = 0;
  std::vector<int32_t> pages;       // page table covering [0, start_pos + tokens.size())
  bool all_logits = false;
  int32_t lora = 0;                 // SeqInput::lora
  bool select = false;              // BeginStep(begin_tokens) before, EndStep after the forward
  int64_t begin_tokens = 0;
  bool prefill_done = false;        // OnPrefill(start_pos + tokens.size()) after the forward
  bool has_spec = false;            // first appearance: create the policy from spec and seed
  SelectionSpec spec;
  uint64_t seed = 0;
};

struct LoraLoad {
  std::string name, path;
};

struct StepMessage {
  enum class Kind : uint8_t { kStep = 1, kHeartbeat = 2, kShutdown = 3, kLora = 4 };
  Kind kind = Kind::kStep;
  std::vector<uint64_t> finished;
  std::vector<int32_t> reset_pages;
  std::vector<StepEntry> entries;
  std::vector<LoraLoad> lora_loads;  // kLora
  std::vector<int32_t> lora_frees;   // kLora
};

std::string EncodeStepMessage(const StepMessage& m);
absl::StatusOr<StepMessage> DecodeStepMessage(const std::string& bytes);

constexpr size_t kStepMessageFirstChunk = 4096;

// Rank 0 (root): broadcasts m to every rank.
absl::Status SendStepMessage(Communicator* comm, const StepMessage& m);
// Ranks > 0: the next message from rank 0.
absl::StatusOr<StepMessage> ReceiveStepMessage(Communicator* comm);

// After a kLora message with loads, on every rank: failed[i] says whether this rank could not
// read load i; returns how many ranks failed each (the same on every rank).
absl::StatusOr<std::vector<int>> AgreeOnLoraLoads(Communicator* comm,
                                                  const std::vector<bool>& failed);

// The start-up handshake: rank 0 sends the KV geometry it chose; followers adopt it.
struct TpHello {
  int32_t page_size = 0;
  int32_t max_context = 0;
  int64_t kv_pages = 0;
  int32_t n_layers = 0, vocab_size = 0;  // checked against the follower's model
  int32_t n_loras = 0;                   // and its LoRA adapters, in order (LoraDigest)
  uint64_t lora_digest = 0;
};
absl::Status BroadcastHello(Communicator* comm, TpHello* hello);  // in on rank 0, out elsewhere

}  // namespace tinyserve
