#include "worker/tp/tp_follower.h"

#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "common/fp16.h"
#include "common/log.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "worker/kv/paged_kv_cache.h"
#include "worker/model/weight_source.h"
#include "worker/runner/transformer.h"
#include "worker/select/selector.h"
#include "worker/tp/step_message.h"

namespace tinyserve {

struct TpFollower::State {
  Communicator* comm = nullptr;
  std::unique_ptr<WeightSource> source;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<TransformerRunner> runner;
  std::unique_ptr<PagedKvCache> kv;
  TpHello hello;
  std::unordered_map<uint64_t, std::unique_ptr<Policy>> policies;
  std::vector<float> logits;
  int64_t steps = 0;

  absl::Status Step(const StepMessage& m);
  absl::Status ApplyLora(const StepMessage& m);
};

absl::StatusOr<std::unique_ptr<TpFollower>> TpFollower::Create(const TpFollowerOptions& options,
                                                               Communicator* comm) {
  if (comm == nullptr || comm->rank() == 0)
    return absl::InvalidArgumentError("a follower is a rank > 0 with a communicator");
  auto st = std::make_unique<State>();
  st->comm = comm;
  TS_ASSIGN_OR_RETURN(st->source, OpenWeightSource(options.model_path));
  TS_ASSIGN_OR_RETURN(st->source, WithRopeScaling(std::move(st->source), options.rope_scaling));
  st->pool = std::make_unique<ThreadPool>(std::max(1, options.threads));
  RunnerOptions ro;
  ro.rank = comm->rank();
  ro.world_size = comm->world_size();
  ro.comm = comm;
  ro.pool = st->pool.get();
  // The RoPE table covers the model's whole context; rank 0 may cap it lower, never higher.
  TS_ASSIGN_OR_RETURN(st->runner, TransformerRunner::Create(*st->source, ro));
  TS_ASSIGN_OR_RETURN(const std::vector<LoraInfo> loras, AddLoras(options.loras, st->runner.get()));
  // Rank 0 sends the hello once its own engine is built (Engine::Create).
  TS_RETURN_IF_ERROR(BroadcastHello(comm, &st->hello));
  const ModelConfig& mc = st->runner->config();
  if (st->hello.n_loras != static_cast<int32_t>(loras.size()) ||
      st->hello.lora_digest != LoraDigest(loras))
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", comm->rank(), ": rank 0 serves ", st->hello.n_loras,
                     " LoRA adapters, this rank loaded ", loras.size(),
                     " (the --lora flags must name the same adapters in the same order)"));
  if (st->hello.n_layers != mc.n_layers || st->hello.vocab_size != mc.vocab_size ||
      st->hello.page_size < 1 || st->hello.kv_pages < 1)
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", comm->rank(), ": rank 0 serves a different model (", st->hello.n_layers,
        " layers, vocab ", st->hello.vocab_size, ") than ", options.model_path, " (",
        mc.n_layers, " layers, vocab ", mc.vocab_size, ")"));
  st->kv = std::make_unique<PagedKvCache>(
      st->runner->MakeKvConfig(st->hello.page_size, st->hello.kv_pages));
  // The group is complete when every rank has its cache: rank 0's engine waits here too.
  TS_RETURN_IF_ERROR(comm->Barrier());
  comm->StartupDone();
  TS_LOG(INFO) << "tensor-parallel rank " << comm->rank() << " of " << comm->world_size()
               << ": " << st->runner->local_heads() << " heads, " << st->runner->local_kv_heads()
               << " KV heads, " << st->hello.kv_pages << " pages of " << st->hello.page_size;
  return std::unique_ptr<TpFollower>(new TpFollower(std::move(st)));
}

TpFollower::TpFollower(std::unique_ptr<State> state) : state_(std::move(state)) {}
TpFollower::~TpFollower() = default;

int64_t TpFollower::steps() const { return state_->steps; }

absl::Status TpFollower::State::Step(const StepMessage& m) {
  for (uint64_t id : m.finished) policies.erase(id);
  for (int32_t p : m.reset_pages) {
    if (p < 0 || p >= hello.kv_pages)
      return absl::DataLossError(absl::StrCat("step message: page ", p, " out of range"));
    kv->ResetPage(p);
  }
  if (m.entries.empty()) return absl::OkStatus();
  std::vector<SeqInput> batch(m.entries.size());
  std::vector<Policy*> selected(m.entries.size(), nullptr);
  for (size_t i = 0; i < m.entries.size(); ++i) {
    const StepEntry& e = m.entries[i];
    if (e.has_spec) {
      const PolicyContext ctx = MakePolicyContext(runner->config(), runner->local_kv_heads(),
                                                  hello.page_size, KvDtype::kF16, e.seed);
      TS_ASSIGN_OR_RETURN(policies[e.seq], CreatePolicy(e.spec, ctx));
    }
    SeqInput& in = batch[i];
    in.tokens = e.tokens.data();
    in.n = static_cast<int>(e.tokens.size());
    in.start_pos = e.start_pos;
    in.pages = &e.pages;
    in.all_logits = e.all_logits;
    in.lora = e.lora;
    if (e.select) {
      auto it = policies.find(e.seq);
      if (it == policies.end())
        return absl::DataLossError(absl::StrCat("step message: no policy for sequence ", e.seq));
      it->second->BeginStep(e.begin_tokens);
      in.selector = it->second.get();
      selected[i] = it->second.get();
    }
  }
  TS_RETURN_IF_ERROR(runner->Forward(batch, kv.get(), &logits));
  for (size_t i = 0; i < m.entries.size(); ++i) {
    const StepEntry& e = m.entries[i];
    if (selected[i] != nullptr) selected[i]->EndStep();
    if (e.prefill_done) {
      auto it = policies.find(e.seq);
      if (it != policies.end())
        it->second->OnPrefill(e.start_pos + static_cast<int64_t>(e.tokens.size()));
    }
  }
  ++steps;
  return absl::OkStatus();
}

absl::Status TpFollower::State::ApplyLora(const StepMessage& m) {
  for (int32_t id : m.lora_frees) runner->RemoveLora(id);
  if (m.lora_loads.empty()) return absl::OkStatus();
  std::vector<TransformerRunner::PreparedLora> prepared(m.lora_loads.size());
  std::vector<bool> failed(m.lora_loads.size(), false);
  for (size_t i = 0; i < m.lora_loads.size(); ++i) {
    const LoraLoad& l = m.lora_loads[i];
    absl::StatusOr<std::unique_ptr<LoraAdapter>> a =
        LoraAdapter::Open(l.name, l.path, runner->config());
    absl::StatusOr<TransformerRunner::PreparedLora> p =
        a.ok() ? runner->PrepareLora(**a) : a.status();
    if (p.ok()) {
      prepared[i] = std::move(*p);
    } else {
      failed[i] = true;
      TS_LOG(ERROR) << "tensor-parallel rank " << comm->rank() << ": cannot load LoRA adapter '"
                    << l.name << "': " << p.status();
    }
  }
  TS_ASSIGN_OR_RETURN(const std::vector<int> failures, AgreeOnLoraLoads(comm, failed));
  for (size_t i = 0; i < prepared.size(); ++i)
    if (failures[i] == 0) runner->InstallLora(std::move(prepared[i]));
  return absl::OkStatus();
}

absl::Status TpFollower::Run() {
  State& s = *state_;
  for (;;) {
    absl::StatusOr<StepMessage> m = ReceiveStepMessage(s.comm);
    if (!m.ok()) return m.status();
    switch (m->kind) {
      case StepMessage::Kind::kShutdown:
        TS_LOG(INFO) << "tensor-parallel rank " << s.comm->rank() << ": shutdown after "
                     << s.steps << " steps";
        return absl::OkStatus();
      case StepMessage::Kind::kHeartbeat:
        for (uint64_t id : m->finished) s.policies.erase(id);
        TS_RETURN_IF_ERROR(s.comm->Barrier());
        break;
      case StepMessage::Kind::kStep:
        TS_RETURN_IF_ERROR(s.Step(*m));
        break;
      case StepMessage::Kind::kLora:
        TS_RETURN_IF_ERROR(s.ApplyLora(*m));
        break;
    }
  }
}

absl::Status RunTpFollower(const TpFollowerOptions& options, Communicator* comm) {
  TS_ASSIGN_OR_RETURN(auto follower, TpFollower::Create(options, comm));
  return follower->Run();
}

}  // namespace tinyserve
