// nccl_one_rank_check: the NCCL communicator on one GPU, for GPU machines (scripts/gpu-check.sh).
//
// Checks, with a group of one rank: all-reduce on a device buffer and on a host buffer (staged),
// broadcast, barrier; and the timeout path: a group of two whose second rank never comes must
// fail the rendezvous with DeadlineExceeded within its timeout instead of hanging. (A real
// multi-GPU run is pending while only one GPU is lent.)
//
// Prints one line per check and "OK" or "FAIL" last; exits 0 on success, 1 on failure, and 77
// ("no GPU", the CTest skip code) when no CUDA device is usable.
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "common/timer.h"
#include "worker/tp/nccl_communicator.h"
#include "worker/tp/tcp_store.h"

namespace {

int failures = 0;

void Check(bool ok, const char* what, const std::string& detail = "") {
  std::printf("%s %s%s%s\n", ok ? "ok  " : "FAIL", what, detail.empty() ? "" : ": ",
              detail.c_str());
  if (!ok) ++failures;
}

}  // namespace

int main() {
  using tinyserve::MakeNcclCommunicator;
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::printf("no GPU: skipped\n");
    return 77;
  }
  auto store = tinyserve::TcpStoreServer::Listen("127.0.0.1", 0);
  if (!store.ok()) {
    std::printf("FAIL store: %s\n", std::string(store.status().message()).c_str());
    return 1;
  }
  auto comm = MakeNcclCommunicator(0, 1, "127.0.0.1:0", 30, 0, std::move(*store));
  Check(comm.ok(), "init one rank", comm.ok() ? "" : comm.status().ToString());
  if (comm.ok()) {
    tinyserve::Communicator& c = **comm;
    // Host buffer (staged through the device): a one-rank sum is the identity.
    std::vector<float> host = {1.5f, -2.0f, 3.25f, 0.0f};
    absl::Status s = c.AllReduceSum(host.data(), host.size());
    Check(s.ok() && host[0] == 1.5f && host[1] == -2.0f && host[2] == 3.25f,
          "all-reduce host buffer", s.ToString());
    // Device buffer, in place.
    const size_t n = 1 << 20;
    std::vector<float> src(n), back(n);
    for (size_t i = 0; i < n; ++i) src[i] = static_cast<float>(i % 1000) * 0.5f;
    float* dev = nullptr;
    if (cudaMalloc(&dev, n * sizeof(float)) == cudaSuccess) {
      cudaMemcpy(dev, src.data(), n * sizeof(float), cudaMemcpyHostToDevice);
      s = c.AllReduceSum(dev, n);
      cudaMemcpy(back.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost);
      Check(s.ok() && back == src, "all-reduce device buffer (1M floats)", s.ToString());
      cudaFree(dev);
    } else {
      Check(false, "cudaMalloc");
    }
    char msg[64] = "tensor parallel hello";
    s = c.Broadcast(msg, sizeof(msg), 0);
    Check(s.ok() && std::string(msg) == "tensor parallel hello", "broadcast", s.ToString());
    s = c.Barrier();
    Check(s.ok(), "barrier", s.ToString());
    Check(!c.Broadcast(msg, sizeof(msg), 3).ok(), "broadcast rejects a bad root");
  }
  comm = absl::UnavailableError("released");
  // Timeout path: two ranks expected, one present.
  auto store2 = tinyserve::TcpStoreServer::Listen("127.0.0.1", 0);
  if (store2.ok()) {
    const double t0 = tinyserve::NowSeconds();
    auto lonely = MakeNcclCommunicator(0, 2, "127.0.0.1:0", 5, 0, std::move(*store2));
    const double took = tinyserve::NowSeconds() - t0;
    Check(!lonely.ok() && took < 15, "missing rank times out",
          lonely.ok() ? "unexpectedly OK"
                      : lonely.status().ToString() + " after " + std::to_string(took) + " s");
  }
  std::printf("%s\n", failures == 0 ? "OK" : "FAIL");
  return failures == 0 ? 0 : 1;
}
