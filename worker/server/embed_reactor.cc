#include "worker/server/embed_reactor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/timer.h"
#include "worker/server/api_util.h"
#include "worker/server/proto_convert.h"
#include "worker/server/rpc_security.h"
#include "worker/server/status_convert.h"

namespace tinyserve {

namespace v1 = tinyserve::v1;

// The inputs of one call, their results, and which of them the engine is running.
class EmbedJob : public std::enable_shared_from_this<EmbedJob> {
 public:
  EmbedJob(WorkerState* state, grpc::ServerUnaryReactor* reactor, grpc::ByteBuffer* out,
           std::string id, std::vector<GenerateRequest> inputs, bool normalize)
      : state_(state),
        reactor_(reactor),
        out_(out),
        id_(std::move(id)),
        inputs_(std::move(inputs)),
        normalize_(normalize) {
    response_.set_request_id(id_);
    for (size_t i = 0; i < inputs_.size(); ++i) response_.add_embeddings();
  }

  void Start() {
    std::lock_guard<std::mutex> lock(mu_);
    SubmitMore();
  }
  void Cancel(const char* why);
  void OnEmbedding(size_t i, const std::vector<float>& values);
  void OnFinish(size_t i, FinishReason reason, const RequestUsage& usage, absl::Status status);

 private:
  // In the server's reserved "__" namespace, so no caller's id can equal it.
  std::string EngineId(size_t i) const { return absl::StrCat("__embed/", id_, "/", i); }
  // Submits inputs while fewer than the engine's batch are running (under mu_).
  void SubmitMore();
  // Ends the call (once): aborts what still runs; the reactor is not touched afterwards.
  void End(const grpc::Status& status);

  WorkerState* state_;
  grpc::ServerUnaryReactor* reactor_;
  grpc::ByteBuffer* out_;
  const std::string id_;
  std::vector<GenerateRequest> inputs_;
  const bool normalize_;
  std::mutex mu_;
  v1::EmbedResponse response_;   // GUARDED_BY(mu_)
  size_t next_ = 0;              // GUARDED_BY(mu_) the next input to submit
  std::vector<size_t> running_;  // GUARDED_BY(mu_)
  size_t done_ = 0;              // GUARDED_BY(mu_)
  bool ended_ = false;           // GUARDED_BY(mu_)
};

namespace {

class EmbedSink final : public RequestSink {
 public:
  EmbedSink(std::shared_ptr<EmbedJob> job, size_t index) : job_(std::move(job)), index_(index) {}
  void OnTokens(const std::vector<GeneratedToken>&, const RequestUsage&) override {}
  void OnEmbedding(const std::vector<float>& values) override { job_->OnEmbedding(index_, values); }
  void OnFinish(FinishReason reason, const RequestUsage& usage, absl::Status status) override {
    job_->OnFinish(index_, reason, usage, std::move(status));
  }

 private:
  std::shared_ptr<EmbedJob> job_;
  size_t index_;
};

}  // namespace

void EmbedJob::SubmitMore() {
  const EngineOptions& o = state_->engine->options();
  const size_t window = static_cast<size_t>(std::max(1, std::min(o.max_batch, o.max_queue)));
  while (!ended_ && next_ < inputs_.size() && running_.size() < window) {
    const size_t i = next_++;
    GenerateRequest r = inputs_[i];
    r.request_id = EngineId(i);
    r.continues_call = i > 0;  // the call was accepted: a drain lets it finish
    running_.push_back(i);
    const absl::Status s =
        state_->engine->Submit(std::move(r), std::make_shared<EmbedSink>(shared_from_this(), i));
    if (!s.ok()) {
      running_.pop_back();
      if (absl::IsResourceExhausted(s) && !running_.empty()) {
        --next_;  // the queue filled with other traffic: again when one of ours finishes
        return;
      }
      grpc::Status g = ToGrpcStatus(s);
      if (g.error_code() == grpc::StatusCode::INVALID_ARGUMENT)
        g = grpc::Status(g.error_code(), absl::StrCat("inputs[", i, "]: ", g.error_message()));
      End(g);
      return;
    }
    if (state_->metrics != nullptr) state_->metrics->CountLoraRequest(inputs_[i].lora);
  }
}

void EmbedJob::End(const grpc::Status& status) {
  ended_ = true;
  for (size_t i : running_) state_->engine->Abort(EngineId(i));
  if (status.ok()) *out_ = ToByteBuffer(response_);
  state_->RemoveLive(id_);
  reactor_->Finish(status);
  reactor_ = nullptr;
}

void EmbedJob::Cancel(const char* why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ended_) End(grpc::Status(grpc::StatusCode::CANCELLED, why));
}

void EmbedJob::OnEmbedding(size_t i, const std::vector<float>& values) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ended_) return;
  double norm = 0;
  for (float v : values) norm += static_cast<double>(v) * v;
  const float scale = normalize_ && norm > 0 ? static_cast<float>(1 / std::sqrt(norm)) : 1.0f;
  auto* dst = response_.mutable_embeddings(static_cast<int>(i))->mutable_values();
  dst->Reserve(static_cast<int>(values.size()));
  for (float v : values) dst->Add(v * scale);
}

void EmbedJob::OnFinish(size_t i, FinishReason reason, const RequestUsage& usage,
                        absl::Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  running_.erase(std::find(running_.begin(), running_.end(), i));
  if (ended_) return;
  if (reason != FinishReason::kLength) {
    if (reason == FinishReason::kError) {
      End(status.ok() ? grpc::Status(grpc::StatusCode::INTERNAL, "engine error")
                      : ToGrpcStatus(status));
    } else if (reason == FinishReason::kDeadline) {
      End(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded"));
    } else {
      End(grpc::Status(grpc::StatusCode::ABORTED, absl::StrCat("inputs[", i, "] was aborted")));
    }
    return;
  }
  response_.mutable_embeddings(static_cast<int>(i))->set_prompt_tokens(usage.prompt_tokens);
  if (state_->metrics != nullptr) state_->metrics->CountEmbedding();
  response_.set_prompt_tokens(response_.prompt_tokens() + usage.prompt_tokens);
  if (++done_ == inputs_.size()) {
    End(grpc::Status::OK);
    return;
  }
  SubmitMore();
}

EmbedReactor::EmbedReactor(WorkerState* state, grpc::CallbackServerContext* context,
                           const grpc::ByteBuffer& buffer, grpc::ByteBuffer* response) {
  if (grpc::Status s = CheckApiKey(*context, state->api_key); !s.ok()) {
    Finish(s);
    return;
  }
  absl::Status status;
  absl::StatusOr<std::vector<GenerateRequest>> inputs = Parse(state, *context, buffer);
  if (inputs.ok()) {
    const std::string id = request_id_.empty() ? state->NewRequestId() : request_id_;
    job_ = std::make_shared<EmbedJob>(state, this, response, id, std::move(*inputs), normalize_);
    // Abort(<call id>) ends the call as a client's cancel would, from the moment it is live.
    std::weak_ptr<EmbedJob> weak = job_;
    if (state->AddLive(id, [weak] {
          if (auto job = weak.lock()) job->Cancel("aborted (Abort)");
        })) {
      std::shared_ptr<EmbedJob> job = job_;  // the call may end (and delete this) inside Start
      job->Start();
      return;
    }
    job_.reset();
    status = absl::AlreadyExistsError(absl::StrCat("request_id '", id, "' is already in use"));
  } else {
    status = inputs.status();
  }
  if (state->metrics != nullptr) state->metrics->CountRefusal(status.code());
  Finish(ToGrpcStatus(status));
}

absl::StatusOr<std::vector<GenerateRequest>> EmbedReactor::Parse(
    WorkerState* state, const grpc::CallbackServerContext& context,
    const grpc::ByteBuffer& buffer) {
  if (state->draining.load()) return absl::UnavailableError("worker is draining");
  if (!state->ready.load()) return absl::UnavailableError("worker is not ready");
  v1::EmbedRequest request;
  if (grpc::Status s = ParseRequest(buffer, &request); !s.ok())
    return absl::InvalidArgumentError(s.error_message());
  request_id_ = request.request_id();
  normalize_ = request.normalize();
  const Engine& engine = *state->engine;
  TS_ASSIGN_OR_RETURN(std::vector<GenerateRequest> inputs,
                      ToEngineEmbedRequests(request, engine.tokenizer(), engine.loras()));
  const double deadline = EngineDeadline(context);
  if (deadline > 0 && deadline <= NowSeconds())
    return absl::DeadlineExceededError("deadline already passed");
  for (GenerateRequest& r : inputs) r.deadline = deadline;
  return inputs;
}

void EmbedReactor::OnCancel() {
  if (job_) job_->Cancel("cancelled by the client");
}

}  // namespace tinyserve
