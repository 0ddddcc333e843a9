// File: worker/tp/tp_follower.h
// The loop of a tensor-parallel rank > 0: replay rank 0's steps on this rank's shard.
//
// A follower loads its shard of the model (TransformerRunner for (rank, world_size)), takes the
// KV geometry from rank 0's hello (page size, pages: rank 0 owns allocation, so page ids are the
// same on every rank), then loops: receive a StepMessage (step_message.h), reset the pages rank 0
// (re)allocated, drop the policies of finished sequences, create the policies of new ones, and
// run Forward on its own PagedKvCache with the policies' BeginStep/EndStep around it; the
// runner's all-reduces meet rank 0's. Heartbeats are answered with a Barrier; LoRA changes
// (adapters loaded or unloaded at run time) are read and agreed on as step_message.h says;
// shutdown returns OK. Any collective error (rank 0 gone, a peer dead, a timeout) returns that
// error: the process should exit non-zero.
//
// The follower's logits are computed (the LM head is replicated) but unused: rank 0 samples.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/model/lora_adapter.h"
#include "worker/tp/communicator.h"

namespace tinyserve {

struct TpFollowerOptions {
  std::string model_path;
  std::string rope_scaling;  // as rank 0's EngineOptions::rope_scaling
  int threads = 1;
  std::vector<LoraModule> loras;  // as rank 0's EngineOptions::loras
};

class TpFollower {
 public:
  // Loads the shard and completes the hello with rank 0 (whose Engine::Create sends it).
  static absl::StatusOr<std::unique_ptr<TpFollower>> Create(const TpFollowerOptions& options,
                                                            Communicator* comm);
  ~TpFollower();
  // Replays steps until rank 0 sends shutdown (OK) or a collective fails (the error).
  absl::Status Run();
  int64_t steps() const;

  struct State;

 private:
  explicit TpFollower(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// Create + Run.
absl::Status RunTpFollower(const TpFollowerOptions& options, Communicator* comm);

}  // namespace tinyserve
