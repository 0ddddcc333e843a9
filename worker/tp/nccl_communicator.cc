#include "worker/tp/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"
#include "common/timer.h"
#include "worker/tp/tcp_store.h"

// Returns a Status naming the call when a NCCL call fails (ncclInProgress is not a failure
// for a non-blocking communicator: the caller polls).
#define TS_NCCL_CHECK(call)                                                            \
  do {                                                                                 \
    const ncclResult_t ts_nccl_r_ = (call);                                            \
    if (ts_nccl_r_ != ncclSuccess && ts_nccl_r_ != ncclInProgress)                     \
      return ::tinyserve::NcclError(#call, ts_nccl_r_);                                \
  } while (0)

#define TS_CUDA_CHECK(call)                                                            \
  do {                                                                                 \
    const cudaError_t ts_cuda_r_ = (call);                                             \
    if (ts_cuda_r_ != cudaSuccess)                                                     \
      return ::absl::InternalError(                                                    \
          ::absl::StrCat(#call, ": ", cudaGetErrorString(ts_cuda_r_)));                \
  } while (0)

namespace tinyserve {
namespace {

absl::Status NcclError(const char* what, ncclResult_t r) {
  const std::string msg = absl::StrCat(what, ": ", ncclGetErrorString(r));
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(msg);
    case ncclRemoteError:
    case ncclSystemError:
      return absl::UnavailableError(msg);
    default:
      return absl::InternalError(msg);
  }
}

bool IsDevicePointer(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // clear: an unregistered host pointer may report an error
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(int rank, int world, int device, double timeout_s)
      : rank_(rank), world_(world), device_(device), timeout_s_(timeout_s) {}

  ~NcclCommunicator() override {
    if (comm_ != nullptr) {  // null after a failure: Fail() aborted (and freed) it
      cudaSetDevice(device_);
      // Flush, then free; bounded like everything else (Wait aborts on timeout).
      ncclCommFinalize(comm_);
      if (Wait("ncclCommFinalize").ok()) ncclCommDestroy(comm_);
    }
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Init(const ncclUniqueId& id) {
    TS_CUDA_CHECK(cudaSetDevice(device_));
    TS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // calls return at once; Wait() polls with the timeout
    TS_NCCL_CHECK(ncclCommInitRankConfig(&comm_, world_, id, rank_, &config));
    return Wait("ncclCommInitRankConfig");
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  absl::Status AllReduceSum(float* data, size_t n) override {
    if (!broken_.ok()) return broken_;
    if (n == 0) return absl::OkStatus();
    return OnDevice(data, n * sizeof(float), true, [&](void* d) -> absl::Status {
      TS_NCCL_CHECK(ncclAllReduce(d, d, n, ncclFloat32, ncclSum, comm_, stream_));
      return absl::OkStatus();
    });
  }

  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    if (!broken_.ok()) return broken_;
    if (root < 0 || root >= world_)
      return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root));
    if (bytes == 0) return absl::OkStatus();
    return OnDevice(data, bytes, rank_ == root, [&](void* d) -> absl::Status {
      TS_NCCL_CHECK(ncclBroadcast(d, d, bytes, ncclUint8, root, comm_, stream_));
      return absl::OkStatus();
    });
  }

  absl::Status Barrier() override {
    float one = 1.0f;
    return AllReduceSum(&one, 1);
  }

 private:
  // Runs op on a device copy of [data, data + bytes) (data itself when it is on the device),
  // waits for it within the timeout, and copies the result back to a host buffer.
  template <typename Op>
  absl::Status OnDevice(void* data, size_t bytes, bool upload, Op&& op) {
    TS_CUDA_CHECK(cudaSetDevice(device_));
    void* d = data;
    const bool staged = !IsDevicePointer(data);
    if (staged) {
      if (scratch_bytes_ < bytes) {
        if (scratch_ != nullptr) cudaFree(scratch_);
        scratch_ = nullptr;
        scratch_bytes_ = 0;
        TS_CUDA_CHECK(cudaMalloc(&scratch_, bytes));
        scratch_bytes_ = bytes;
      }
      d = scratch_;
      if (upload)
        TS_CUDA_CHECK(cudaMemcpyAsync(d, data, bytes, cudaMemcpyHostToDevice, stream_));
    }
    if (absl::Status s = op(d); !s.ok()) return Fail(s);
    TS_RETURN_IF_ERROR(Wait("collective"));
    if (staged) {
      TS_CUDA_CHECK(cudaMemcpyAsync(data, d, bytes, cudaMemcpyDeviceToHost, stream_));
      TS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    return absl::OkStatus();
  }

  // Polls the communicator's state and (when there is one) the stream until both are done, an
  // error shows, or the timeout passes: then aborts.
  absl::Status Wait(const char* what) {
    const double deadline = NowSeconds() + timeout_s_;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) return Fail(NcclError("ncclCommGetAsyncError", r));
      if (state != ncclSuccess && state != ncclInProgress)
        return Fail(NcclError(what, state));
      if (state == ncclSuccess) {
        const cudaError_t q = stream_ != nullptr ? cudaStreamQuery(stream_) : cudaSuccess;
        if (q == cudaSuccess) return absl::OkStatus();
        if (q != cudaErrorNotReady)
          return Fail(absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(q))));
      }
      if (NowSeconds() >= deadline)
        return Fail(absl::DeadlineExceededError(absl::StrCat(
            "nccl ", what, ": not complete within ", timeout_s_, " s (a rank missing or dead?)")));
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  absl::Status Fail(absl::Status s) {
    if (broken_.ok()) {
      broken_ = s;
      TS_LOG(ERROR) << "rank " << rank_ << ": " << s << "; aborting the NCCL communicator";
      if (comm_ != nullptr) ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    return s;
  }

  int rank_, world_, device_;
  double timeout_s_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  absl::Status broken_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(
    int rank, int world, const std::string& rendezvous_addr, double timeout_s, int device,
    std::unique_ptr<TcpStoreServer> server) {
  if (world < 1 || rank < 0 || rank >= world)
    return absl::InvalidArgumentError(absl::StrCat("bad rank ", rank, " of ", world));
  if (!(timeout_s > 0)) return absl::InvalidArgumentError("timeout must be > 0");
  int n_dev = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&n_dev); e != cudaSuccess || n_dev == 0) {
    cudaGetLastError();
    return absl::UnavailableError(absl::StrCat(
        "NCCL: no CUDA device (", e == cudaSuccess ? "none found" : cudaGetErrorString(e), ")"));
  }
  if (device < 0) device = rank % n_dev;
  if (device >= n_dev)
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", device, " of ", n_dev));

  std::string host;
  int port = 0;
  TS_RETURN_IF_ERROR(ParseHostPort(rendezvous_addr, &host, &port));
  if (rank == 0 && server == nullptr) {
    TS_ASSIGN_OR_RETURN(server, TcpStoreServer::Listen(host, port));
  }
  if (rank == 0) port = server->port();
  const std::string connect_host =
      host.empty() || host == "0.0.0.0" || host == "::" ? "127.0.0.1" : host;
  TS_ASSIGN_OR_RETURN(auto client, TcpStoreClient::Connect(connect_host, port, timeout_s));

  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (rank == 0) {
    TS_NCCL_CHECK(ncclGetUniqueId(&id));
    TS_RETURN_IF_ERROR(client->Set("tinyserve-nccl/id",
                                   std::string(reinterpret_cast<const char*>(&id), sizeof(id))));
  } else {
    TS_ASSIGN_OR_RETURN(std::string v, client->Get("tinyserve-nccl/id", timeout_s));
    if (v.size() != sizeof(id)) return absl::DataLossError("NCCL unique id of the wrong size");
    std::memcpy(&id, v.data(), sizeof(id));
  }
  auto comm = std::make_unique<NcclCommunicator>(rank, world, device, timeout_s);
  TS_RETURN_IF_ERROR(comm->Init(id));
  // The store (rank 0's server and every client) is only needed for the rendezvous: the
  // client and server are released here once every rank has initialised.
  TS_RETURN_IF_ERROR(comm->Barrier());
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace tinyserve
