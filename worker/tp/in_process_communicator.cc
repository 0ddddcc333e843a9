#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "worker/tp/communicator.h"

namespace tinyserve {
namespace {

class SingleProcessCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  absl::Status AllReduceSum(float*, size_t) override { return absl::OkStatus(); }
  absl::Status Broadcast(void*, size_t, int) override { return absl::OkStatus(); }
  absl::Status Barrier() override { return absl::OkStatus(); }
};

// Shared state of an in-process group: a generation-counted barrier plus one slot per rank.
struct Shared {
  explicit Shared(int n, double timeout) : world(n), timeout_s(timeout), slots(n) {}
  int world;
  double timeout_s;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  std::vector<void*> slots;

  absl::Status Wait() {
    std::unique_lock<std::mutex> lock(mu);
    const uint64_t gen = generation;
    if (++arrived == world) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return absl::OkStatus();
    }
    if (!cv.wait_for(lock, std::chrono::duration<double>(timeout_s),
                     [&] { return generation != gen; }))
      return absl::DeadlineExceededError(
          absl::StrCat("in-process collective: not all ", world, " ranks arrived in ", timeout_s,
                       " s"));
    return absl::OkStatus();
  }
};

class InProcessCommunicator : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Shared> shared, int rank) : s_(shared), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return s_->world; }

  absl::Status AllReduceSum(float* data, size_t n) override {
    s_->slots[rank_] = data;
    if (auto st = s_->Wait(); !st.ok()) return st;
    // Every rank sums the same inputs in rank order, so results are identical on all ranks.
    std::vector<float> sum(n, 0.0f);
    for (int r = 0; r < s_->world; ++r) {
      const float* p = static_cast<const float*>(s_->slots[r]);
      for (size_t i = 0; i < n; ++i) sum[i] += p[i];
    }
    if (auto st = s_->Wait(); !st.ok()) return st;  // all have read before anyone writes
    std::memcpy(data, sum.data(), n * sizeof(float));
    return s_->Wait();
  }

  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    s_->slots[rank_] = data;
    if (auto st = s_->Wait(); !st.ok()) return st;
    if (rank_ != root) std::memcpy(data, s_->slots[root], bytes);
    return s_->Wait();
  }

  absl::Status Barrier() override { return s_->Wait(); }

 private:
  std::shared_ptr<Shared> s_;
  int rank_;
};

}  // namespace

std::unique_ptr<Communicator> MakeSingleProcessCommunicator() {
  return std::make_unique<SingleProcessCommunicator>();
}

std::vector<std::unique_ptr<Communicator>> MakeInProcessGroup(int world_size,
                                                              double timeout_seconds) {
  auto shared = std::make_shared<Shared>(world_size, timeout_seconds);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < world_size; ++r)
    out.push_back(std::make_unique<InProcessCommunicator>(shared, r));
  return out;
}

}  // namespace tinyserve
